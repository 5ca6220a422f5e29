"""``--expert-offload`` beyond GLM: a tiny qwen3_moe checkpoint (mlx-lm's ``SwitchGLU``
experts, served by the generic plugin) with its routed experts left on disk and read on
demand (``mlxbun_core/experts``) answers exactly as the resident model does, holding no more
expert bytes than its budget; a dense model and a family that loads its own way refuse the
flag at start-up."""

from __future__ import annotations

import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core import loader
from mlxbun_core.cli import build_parser
from mlxbun_core.experts import ExpertsUnsupported
from mlxbun_core.experts.streaming import Streaming
from mlxbun_core.model import LoadOptions
from mlxbun_core.models.facts import weight_bytes
from mlxbun_core.startup import StartFailed, load_engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import mlx_lm_greedy
from mlxbun_core.testing.server import start_server

QWEN3_MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
             "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
             "mlp_only_layers": [], "moe_intermediate_size": 32, "norm_topk_prob": True}
PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def moe():
    return tiny_checkpoint("qwen3", seed=3, dtype="float32", config_overrides=QWEN3_MOE)


def test_streamed_qwen3_moe_answers_as_the_resident_model(moe):
    resident, tok = mlx_load(str(moe))
    want = mlx_lm_greedy(resident, tok.encode(PROMPT), 24, tok.eos_token_ids)
    srv = start_server(moe, options=LoadOptions(extra={"expert_offload": True}))
    try:
        oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
        r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0,
                                   extra_body={"logprobs": True})
        assert [e["id"] for e in r.choices[0].logprobs.content] == want
        streaming = srv.engine.model.extras["expert_streaming"]
        assert isinstance(streaming, Streaming) and streaming.moe_layers == [0, 1]
        cache = streaming.cache
        # the default budget: one token's experts (2 of 8) in each MoE layer
        expert = streaming.index.expert_bytes((0, 0))
        assert cache.budget_bytes == 2 * expert * 2
        assert 0 < cache.resident_bytes <= cache.budget_bytes
        assert cache.stats.misses > 0 and cache.stats.bytes_read > 0
        held = weight_bytes(srv.engine.model.model)  # experts emptied: 0 bytes each
        assert held + cache.budget_bytes < weight_bytes(resident)
    finally:
        srv.stop()


def test_a_budget_wins_and_prefetch_guesses_with_the_linear_router(moe):
    m = loader.claim(moe, LoadOptions(model_id="q", extra={"expert_offload": True,
                                                           "expert_budget": 10 ** 6}))
    streaming = m.extras["expert_streaming"]
    assert streaming.cache.budget_bytes == 10 ** 6
    resident, tok = mlx_load(str(moe))
    ids = tok.encode(PROMPT)
    assert mlx_lm_greedy(m.model, ids, 12, set()) == mlx_lm_greedy(resident, ids, 12, set())
    assert streaming.cache.stats.prefetch_issued > 0  # layer 0 guessed layer 1's top-k


def _args(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_dense_models_and_families_that_cannot_stream_refuse():
    dense = tiny_checkpoint("qwen3", dtype="float32")
    with pytest.raises(ExpertsUnsupported, match="no routed expert tensors"):
        loader.claim(dense, LoadOptions(model_id="d", extra={"expert_offload": True}))
    with pytest.raises(StartFailed) as failed:
        load_engine(_args(str(dense), "--expert-offload"), None)
    assert failed.value.args == (2,)
    own = tiny_checkpoint("minicpm5")  # claimed by its plugin, which loads its own way
    with pytest.raises(ExpertsUnsupported, match="the minicpm5 family .* cannot stream"):
        loader.claim(own, LoadOptions(model_id="c", extra={"expert_offload": True}))
