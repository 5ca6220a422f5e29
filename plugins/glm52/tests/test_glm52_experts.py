"""Routed experts streamed from the checkpoint (``--expert-budget``).

A tiny random GLM-5.2 checkpoint (one dense layer, three MoE layers of 8 experts,
top-2, float32) whose budget holds three experts: greedy output equals the fully
resident mlx-lm model, served through a real loopback server and the openai SDK;
``/stats`` and ``/fit`` carry the ``glm52`` block; the LRU is checked on its own
against the checkpoint's real files.
"""

import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import mlx.core as mx
import mlxbun_glm52
import numpy as np
import pytest
from mlx_lm import load as mlx_load
from mlxbun_glm52.experts import ExpertCache, ExpertIndex, ExpertReader

from mlxbun_core import loader
from mlxbun_core.cli import build_parser
from mlxbun_core.model import LoadOptions
from mlxbun_core.models.facts import weight_bytes
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import rendered_chat
from mlxbun_core.testing.helpers import mlx_lm_greedy
from mlxbun_core.testing.server import start_server

EXPERT = 3 * 64 * 32 * 4  # gate/up/down of one expert, float32 bytes
BUDGET = 3 * EXPERT
MOE_LAYERS = (1, 2, 3)
PROMPTS = ["What is the capital of France?", "Count to five.", "Name a colour."]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("glm_moe_dsa", seed=7, chat_template=mlxbun_glm52.fallback_template(),
                           config_overrides={"num_hidden_layers": 4, "n_routed_experts": 8})


@pytest.fixture(scope="module")
def srv(ckpt):
    s = start_server(ckpt, options=LoadOptions(extra={"expert_budget": BUDGET}))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def resident(ckpt):
    return mlx_load(str(ckpt))[0]


def ids_of(choice) -> list[int]:
    return [e["id"] if isinstance(e, dict) else e.id for e in choice.logprobs.content]


def ask(client, text: str, n: int = 10) -> list[int]:
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}],
                                       max_tokens=n, temperature=0,
                                       extra_body={"logprobs": True})
    return ids_of(r.choices[0])


def reference(srv, resident, text: str, n: int = 10) -> list[int]:
    req = rendered_chat(srv.engine, {"messages": [{"role": "user", "content": text}]})[1]
    return mlx_lm_greedy(resident, req.prompt_tokens, n, srv.engine.model.eos_token_ids)


def glm52_stats(srv) -> dict:
    return httpx.get(srv.v1.removesuffix("/v1") + "/stats", timeout=30).json()["glm52"]


# ---------------------------------------------------------------- served

def test_streamed_greedy_equals_resident_model(client, srv, resident):
    before = glm52_stats(srv)["expert_runtime"]
    assert ask(client, PROMPTS[0]) == reference(srv, resident, PROMPTS[0])
    after = glm52_stats(srv)["expert_runtime"]
    assert after["misses"] > before["misses"] and after["bytes_read"] > before["bytes_read"]


def test_concurrent_rows_equal_resident_model(client, srv, resident):
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        ours = list(pool.map(lambda t: ask(client, t, 8), PROMPTS))
    assert ours == [reference(srv, resident, t, 8) for t in PROMPTS]


def test_stats_block_counts_the_cache(client, srv, ckpt):
    ask(client, PROMPTS[1], 4)
    g = glm52_stats(srv)
    rt = g["expert_runtime"]
    assert g["expert_streaming"] is True and g["expert_budget_bytes"] == BUDGET
    assert 0 < rt["resident_bytes"] <= BUDGET and rt["resident_experts"] <= 3
    assert rt["misses"] > 0 and rt["hits"] + rt["misses"] > 0 and rt["evictions"] > 0
    assert rt["bytes_read"] >= rt["misses"] * EXPERT  # prefetches that missed also read
    assert rt["main_residency"]["misses"] == rt["misses"]
    # prefill needs more experts than three: run in budget-sized groups, nothing over the cap
    assert rt["split_steps"] > 0 and rt["uncached_reads"] == 0
    assert g["main_expert_slab_bytes"] == len(MOE_LAYERS) * 8 * EXPERT
    assert g["mtp_expert_slab_bytes"] == 0
    adm = httpx.get(srv.v1.removesuffix("/v1") + "/stats", timeout=30).json()["admission"]
    assert adm["weights_bytes"] == g["resident_weight_bytes"] + BUDGET  # budget billed


def test_fit_block_and_weights(srv, ckpt):
    fit = httpx.get(srv.v1.removesuffix("/v1") + "/fit", timeout=30).json()
    g = fit["glm52"]
    assert g["artifact_disk_bytes"] == sum(f.stat().st_size
                                           for f in Path(ckpt).glob("*.safetensors"))
    assert g["main_expert_slab_bytes"] == len(MOE_LAYERS) * 8 * EXPERT
    assert g["expert_budget_bytes"] == BUDGET and g["direct_oracle_warm_decode_tps"] is None
    assert fit["report"]["weights_bytes"] == srv.engine.admission.weights_bytes


def test_experts_never_loaded_resident(srv, resident):
    streamed = weight_bytes(srv.engine.model.model)
    assert weight_bytes(resident) - streamed == len(MOE_LAYERS) * 8 * EXPERT


# ---------------------------------------------------------------- loading

def test_resident_model_reports_streaming_off(ckpt):
    m = loader.claim(ckpt, LoadOptions(model_id="whole"))
    block = m.hooks.model_report(model=m, section="stats")["glm52"]
    assert block["expert_streaming"] is False and block["expert_runtime"] is None
    assert block["main_expert_slab_bytes"] == len(MOE_LAYERS) * 8 * EXPERT
    fit = m.hooks.model_report(model=m, section="fit")["glm52"]  # from the headers
    assert fit["main_expert_slab_bytes"] == block["main_expert_slab_bytes"]
    assert fit["mtp_expert_slab_bytes"] == 0 and fit["expert_budget_bytes"] is None
    assert fit["artifact_disk_bytes"] == (Path(ckpt) / "model.safetensors").stat().st_size


def test_budget_below_one_expert_is_refused(ckpt):
    with pytest.raises(ValueError, match="below one expert"):
        loader.claim(ckpt, LoadOptions(model_id="x", extra={"expert_budget": EXPERT - 1}))


def test_quantized_stacked_checkpoint_streams_with_parity(ckpt):
    """An mlx-lm 4-bit conversion: experts stacked as switch_mlp rows, weight/scales/biases."""
    from mlx_lm import convert

    out = Path(tempfile.mkdtemp(prefix="glm52-q-")) / "q"
    convert(str(ckpt), str(out), quantize=True, q_group_size=32, q_bits=4)
    whole = mlx_load(str(out))[0]
    m = loader.claim(out, LoadOptions(model_id="q", extra={"expert_budget": 3 * 4608}))
    prompt = list(range(5, 17))
    assert (mlx_lm_greedy(m.model, prompt, 8, ()) == mlx_lm_greedy(whole, prompt, 8, ()))
    assert m.extras["expert_streaming"].cache.stats.misses > 0


def test_serve_flag_parses_sizes(monkeypatch):
    args = build_parser().parse_args(["serve", "--expert-budget", "2GiB"])
    assert args.expert_budget == 2 << 30
    monkeypatch.setenv("MLXBUN_EXPERT_BUDGET", "1.5")  # a bare number is GB, as --memory-budget
    assert build_parser().parse_args(["serve"]).expert_budget == 1_500_000_000
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--expert-budget", "lots"])
    # handed on as text (--isolate's engine child), it parses back to the same bytes
    again = build_parser().parse_args(["serve", "--expert-budget", str(args.expert_budget)])
    assert again.expert_budget == 2 << 30


def test_serve_flag_reaches_the_plugin(ckpt):
    from mlxbun_core.startup import load_engine

    args = build_parser().parse_args(["serve", str(ckpt), "--expert-budget", f"{BUDGET}B"])
    engine = load_engine(args, None)
    try:
        assert engine.model.extras["expert_streaming"].cache.budget_bytes == BUDGET
        assert engine.admission.weights_bytes == weight_bytes(engine.model.model) + BUDGET
    finally:
        engine.close()


# ---------------------------------------------------------------- the LRU alone

def lru(ckpt, budget: int) -> ExpertCache:
    """The real index and reader over the checkpoint; host arrays kept as numpy."""
    return ExpertCache(ExpertReader(ExpertIndex.scan(ckpt)), budget, workers=2,
                       convert=lambda host, dtypes: host)


def test_lru_hits_misses_evictions_and_cap(ckpt):
    cache = lru(ckpt, 2 * EXPERT)
    on_disk = mx.load(str(Path(ckpt) / "model.safetensors"))
    steps = [([0, 1], 0, 2, 0), ([1], 1, 0, 0), ([2], 0, 1, 1), ([1], 1, 0, 0),
             ([0], 0, 1, 1)]  # (experts, new hits, new misses, new evictions)
    for experts, hits, misses, evictions in steps:
        s0 = (cache.stats.hits, cache.stats.misses, cache.stats.evictions)
        got = cache.fetch(1, experts)
        assert (cache.stats.hits - s0[0], cache.stats.misses - s0[1],
                cache.stats.evictions - s0[2]) == (hits, misses, evictions)
        assert cache.resident_bytes <= 2 * EXPERT
        for e, w in zip(experts, got):
            ref = np.array(on_disk[f"model.layers.1.mlp.experts.{e}.down_proj.weight"])
            assert np.array_equal(w["down_proj.weight"], ref)
    assert (1, 1) in cache and (1, 0) in cache and (1, 2) not in cache  # 2 was oldest
    cache.fetch(1, [0, 2, 3])  # a working set over the cap: 3 is used once, not kept
    assert cache.stats.uncached_reads == 1 and cache.resident_bytes == 2 * EXPERT
    assert (1, 0) in cache and (1, 2) in cache and (1, 3) not in cache
    assert cache.stats.bytes_read == cache.stats.misses * EXPERT
    cache.close()


def test_plan_splits_a_working_set_into_budget_sized_groups(ckpt):
    cache = lru(ckpt, 3 * EXPERT)
    cache.fetch(2, [5, 6])
    assert cache.plan(2, [1, 2, 5]) == [[5, 1, 2]]  # fits: one group
    assert cache.plan(2, [0, 1, 2, 3, 5, 6, 7]) == [[5, 6, 0], [1, 2, 3], [7]]  # held first
    assert cache.stats.split_steps == 1
    cache.close()


def test_lru_prefetch_used_and_wasted(ckpt):
    cache = lru(ckpt, 4 * EXPERT)
    cache.prefetch(2, [4, 5])
    cache.fetch(2, [4, 6])
    s = cache.stats
    assert (s.prefetch_issued, s.prefetch_used, s.prefetch_wasted) == (2, 1, 1)
    assert s.misses == 2 and (2, 4) in cache and (2, 5) not in cache
    cache.prefetch(2, [4])  # already held: nothing to read
    assert s.prefetch_issued == 2
    cache.close()


def test_lru_random_traffic_never_exceeds_cap(ckpt):
    rng = random.Random(3)
    cache = lru(ckpt, 5 * EXPERT)
    asked = 0
    for _ in range(200):
        layer = rng.choice(MOE_LAYERS)
        experts = sorted(rng.sample(range(8), rng.randint(1, 4)))
        if rng.random() < 0.3:
            cache.prefetch(rng.choice(MOE_LAYERS), rng.sample(range(8), 2))
        cache.fetch(layer, experts)
        asked += len(experts)
        assert cache.resident_bytes <= 5 * EXPERT
        assert cache.resident_bytes == sum(n for _, n in cache._lru.values())
    assert cache.stats.hits + cache.stats.misses == asked and cache.stats.evictions > 0
    cache.close()
