"""GLM-5.x's checkpoint-native MTP layer (``mtp.py``): a tiny ``glm_moe_dsa`` checkpoint
carrying ``model.layers.{N}`` (DeepSeek-V3 layout, HF names) drafts for itself by default
(the reference's ``--mtp on``); greedy output equals plain decoding and mlx-lm's on both
lanes; ``--mtp off`` removes the head; a checkpoint without the layer offers none.

The layer is the testing builder's ``"copy"`` head (it proposes the token it was given,
the checkpoint's head tied to its embeddings), so the tiny model's repeats are accepted
drafts: the accept path runs, not only rejections.
"""

from __future__ import annotations

import argparse

import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core import loader
from mlxbun_core.cli import build_parser
from mlxbun_core.engine.speculate.mtp_head import pageable
from mlxbun_core.model import LoadOptions
from mlxbun_core.startup import StartFailed, load_engine, lookup_config
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure, mlx_lm_greedy
from mlxbun_core.testing.mtp import BatchRun
from mlxbun_core.testing.server import start_server

PROMPT = "hello there how are you"
N = 40


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("glm_moe_dsa", mtp="copy", dtype="float32")


@pytest.fixture(scope="module")
def srv(ckpt):
    """The landing gate off, as in tests/test_mtp.py: the tiny model's replies repeat a
    token only now and then, which only a stream that drafts every round catches."""
    with pytest.MonkeyPatch.context() as mp:
        configure(mp, speculation={"batch_gate": False})
        s = start_server(ckpt)  # no flag: GLM drafts with its MTP layer by default
        yield s
        s.stop()


def _ids(r) -> list[int]:
    return [e["id"] for e in r.choices[0].logprobs.content]


def _complete(srv, **body):
    oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    return oai.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0,
                                  extra_body={"logprobs": True, **body})


def test_the_head_loads_through_mlx_lms_sanitize_and_copies(ckpt):
    """The layer's HF tensors (per-expert weights, ``kv_b_proj``) come in through the
    target's own ``sanitize``; its cache is the main layers' ``CacheList``, pageable."""
    model = loader.load(str(ckpt), LoadOptions())
    head = model.hooks.token_predictor(model=model)
    assert head is not None and head.default_on and not head.loaded
    cache = head.make_cache()
    assert head.loaded and pageable(cache) is not None
    assert type(head.head.layer.mlp).__name__ == "DeepseekV32MoE"
    tokens = mx.array([[5, 17, 99, 240, 7]])
    logits, hidden = head.forward(tokens, model.model.make_cache())
    assert mx.allclose(logits, model.model(tokens), atol=1e-5).item()  # the target's own
    picks = [mx.argmax(head.predict(hidden[:, i:i + 1], tokens[:, i:i + 1],
                                    head.make_cache())[0]).item() for i in range(5)]
    assert picks == tokens[0].tolist()
    head.predict(hidden, tokens, cache)
    assert cache[0].caches[0].offset == cache[0].caches[1].offset == 5  # MLA + indexer rows


def test_served_greedy_equals_plain_decoding_and_mlx_lm(srv, ckpt):
    mtp, plain = _complete(srv), _complete(srv, draft_kind="none")
    model, tok = mlx_load(str(ckpt))
    want = mlx_lm_greedy(model, tok.encode(PROMPT), N, tok.eos_token_ids)
    assert _ids(mtp) == _ids(plain) == want
    spec = mtp.usage.model_extra["speculation"]
    assert spec["accepted"] > 0 and spec["drafted"] > spec["accepted"]
    assert plain.usage.model_extra.get("speculation") is None
    stats = httpx.get(srv.base_url + "/stats").json()["speculation"]["mtp"]
    assert stats == {"head": srv.engine.predictor.name, "default": True}


def test_paged_heads_in_shared_steps_equal_plain_decoding(ckpt, monkeypatch):
    """Rows arriving at different steps, MTP and plain, on the batch lane's own pieces:
    every row's head KV (a ``CacheList``: MLA latent and indexer keys) in blocks of one
    pool; each row's tokens are its plain greedy decode. The landing gate is off: rows
    draft every step, as this is about the shared verify over paged heads."""
    configure(monkeypatch, speculation={"batch_gate": False})
    model = loader.load(str(ckpt), LoadOptions())
    head = model.hooks.token_predictor(model=model)
    prompts = [[5, 17, 99, 240, 7, 8, 9], [300, 301, 302], [44] * 11]
    rows = [(0, prompts[0], 24, 3), (2, prompts[1], 20, 2), (3, prompts[2], 16, None)]
    run = BatchRun(model.model, head, rows).run()
    for (_, prompt, budget, _), out in zip(rows, run.out):
        assert out == mlx_lm_greedy(model.model, prompt, budget, set())
    assert sum(u.speculation["accepted"] for u in run.usage[:2]) > 0


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_mtp_off_removes_the_head_and_bad_combinations_fail(ckpt):
    engine = load_engine(_args(str(ckpt), "--mtp", "off", "--batch", "1"), None)
    try:
        assert engine.predictor is None and engine.speculation is None
    finally:
        engine.close()
    assert lookup_config(_args("--mtp", "on")).kind == "mtp"
    for argv in (("--mtp", "on", "--draft-kind", "ngram"), ("--mtp", "off", "--draft-kind",
                                                             "mtp")):
        with pytest.raises(StartFailed):
            lookup_config(_args(*argv))
    headless = tiny_checkpoint("glm_moe_dsa", dtype="float32")
    plain = loader.load(str(headless), LoadOptions())
    assert plain.hooks.token_predictor(model=plain) is None
    with pytest.raises(StartFailed) as failed:
        load_engine(_args(str(headless), "--mtp", "on"), None)
    assert failed.value.args == (2,)
