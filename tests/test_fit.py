"""Fit: KV bytes per token against hand computation and against mlx-lm's own caches;
GET /fit, GET /library and the local rows of GET /v1/models on a real server."""

import json

import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from mlxbun_core.library import fit
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.hub_cache import add_to_hub_cache, library_env, library_hub
from mlxbun_core.testing.server import start_server

LLAMA_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
            "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def test_dense_kv_and_max_safe_context_by_hand():
    # 32 layers x 8 KV heads x 128 head dim x 2 (K, V) x 2 bytes
    assert fit.kv_bytes_per_token(LLAMA_8B) == 32 * 8 * 128 * 2 * 2 == 131072
    weights, budget = 16_000_000_000, 24_000_000_000
    transient = 2048 * (128256 + 4 * 14336) * 4  # one prefill chunk: fp32 logits + MLP
    p = fit.plan(LLAMA_8B, weights, budget)
    assert p.max_safe_context == (budget - weights - transient) // 131072 == 49435
    assert p.fits and p.total_bytes <= budget
    over = fit.plan(LLAMA_8B, weights, budget, context=49436)
    assert not over.fits and over.total_bytes > budget
    assert fit.plan(LLAMA_8B, weights, 200_000_000_000).max_safe_context == 131072  # trained cap
    assert fit.plan(LLAMA_8B, weights, 15_000_000_000).max_safe_context == 0
    # an 8-bit KV cache: one byte plus a bf16 scale and bias per 64 elements
    want = 32 * 8 * 128 * 2 * (1 + 4 / 64)
    assert fit.kv_bytes_per_token(LLAMA_8B, fit.kv_element_bytes(2, 8)) == want


def test_sliding_window_layers_stop_growing_at_their_window():
    cfg = {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
           "head_dim": 256, "sliding_window": 1024, "sliding_window_pattern": 6}
    per = 4 * 256 * 2 * 2
    kv = fit.kv_layout(cfg)
    assert kv.layers == {"sliding": 5, "full": 1}
    assert kv.bytes_at(500) == 6 * per * 500
    assert kv.bytes_at(10_000) == per * 10_000 + 5 * per * 1024


def test_linear_attention_layers_cost_a_fixed_state():
    cfg = {"text_config": {
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 2,
        "head_dim": 256, "layer_types": ["linear_attention"] * 3 + ["full_attention"] + (
            ["linear_attention"] * 3 + ["full_attention"]),
        "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": 32,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "dtype": "bfloat16"}}
    conv = 3 * (2 * 16 * 128 + 32 * 128) * 2  # kernel-1 steps of the conv input, bf16
    state = 32 * 128 * 128 * 4  # fp32 recurrent state
    kv = fit.kv_layout(cfg)
    assert kv.fixed_bytes == 6 * (conv + state)
    assert kv.bytes_at(1000) == 6 * (conv + state) + 2 * 2 * 256 * 2 * 2 * 1000


def _cache_bytes(c) -> int:
    """Bytes a cache holds for the tokens it has seen (not its preallocated tail)."""
    if hasattr(c, "caches"):
        return sum(_cache_bytes(x) for x in c.caches)
    if type(c).__name__ in ("KVCache", "RotatingKVCache"):
        n = min(c.offset, c.keys.shape[2])
        return sum(a.nbytes // a.shape[2] * n for a in (c.keys, c.values))
    return sum(a.nbytes for a in c.cache if a is not None)


@pytest.mark.parametrize("family", ["gemma3_text", "gemma4", "qwen3_5", "glm_moe_dsa"])
def test_formula_equals_mlx_lm_cache_bytes(family):
    """Sliding, K=V, linear-state and latent/indexer layers: the formula is the bytes
    mlx-lm's own caches hold after a prefill past the window and one decode step."""
    path = tiny_checkpoint(family)
    config = json.loads((path / "config.json").read_text())
    model, _ = load_model(path)
    cache = make_prompt_cache(model)
    model(mx.array([[5] * 600]), cache=cache)
    model(mx.array([[6]]), cache=cache)
    mx.eval([c.state for c in cache])
    assert sum(_cache_bytes(c) for c in cache) == fit.kv_layout(config).bytes_at(601)


# ---------------------------------------------------------------- on a server

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in library_env(root).items():
            mp.setenv(k, v)
        snaps = library_hub(root / "hf" / "hub")
        yield root, snaps


@pytest.fixture(scope="module")
def srv(hub):
    s = start_server(hub[1]["acme/Tiny-Llama-Chat"])
    yield s
    s.stop()


def test_fit_route_matches_hand_computation(srv, hub):
    snap = hub[1]["acme/Tiny-Llama-Chat"]
    real = sum(v.nbytes for v in mx.load(str(snap / "model.safetensors")).values())
    r = httpx.get(srv.base_url + "/fit", params={"ctx": 1000}, timeout=30).json()
    rep, machine = r["report"], r["machine"]
    # tiny llama: 2 layers x 2 KV heads x 16 head dim x 2 (K, V) x 2 bytes (bf16)
    assert rep["kv_bytes_per_token"] == 2 * 2 * 16 * 2 * 2 == 256
    assert rep["weights_bytes"] == real
    assert rep["kv_bytes"] == 256 * 1000
    assert rep["transient_bytes"] == 1000 * (1024 + 4 * 128) * 4  # vocab 1024, MLP 128
    assert rep["total_bytes"] == real + 256_000 + rep["transient_bytes"]
    assert rep["usable_bytes"] == machine["usable_bytes"] == fit.machine().usable_bytes > 0
    assert rep["fits"] and rep["max_safe_context"] == 131072  # the trained length caps it
    assert machine["bandwidth_source"] == "measured" and machine["bandwidth_gbs"] > 0
    assert rep["predicted_decode_tps"] == pytest.approx(  # a measured rate is used as is
        machine["bandwidth_gbs"] * 1e9 / (real + 256_000), rel=1e-3)
    whole = httpx.get(srv.base_url + "/fit", timeout=30).json()
    assert whole["context_tokens"] == whole["report"]["max_safe_context"] == 131072
    assert whole["sku_matrix"] and all(row["fits"] for row in whole["sku_matrix"])
    assert httpx.get(srv.base_url + "/fit", params={"ctx": "x"}).status_code == 400


def test_v1_models_lists_served_first_then_local_rows(srv, hub):
    client = openai.OpenAI(base_url=srv.v1, api_key="unused", max_retries=0)
    data = client.models.list().data
    assert data[0].id == "acme/Tiny-Llama-Chat" and data[0].capabilities["chat_completions"]
    rows = {m.id: m for m in data[1:]}
    assert sorted(rows) == ["acme/Tiny-Gemma4-it", "other/Qwen3-Tiny"]
    gemma = rows["acme/Tiny-Gemma4-it"]
    assert gemma.tier == "targeted" and rows["other/Qwen3-Tiny"].tier == "generic"
    assert gemma.vision is False and gemma.audio is False
    assert all(m.created == srv.engine.started_at for m in data)
    one = httpx.get(srv.v1 + "/models/other/Qwen3-Tiny").json()  # retrieve: the row itself
    assert one["id"] == "other/Qwen3-Tiny" and one["object"] == "model"


def test_library_rows_carry_fit_and_cache_for_30s(srv, hub):
    rows = httpx.get(srv.base_url + "/library", timeout=30).json()["models"]
    by = {r["repo_id"]: r for r in rows}
    assert sorted(by) == ["acme/Tiny-Gemma4-it", "acme/Tiny-Llama-Chat", "other/Qwen3-Tiny"]
    assert by["acme/Tiny-Llama-Chat"]["serving"] and not by["other/Qwen3-Tiny"]["serving"]
    a = by["other/Qwen3-Tiny"]["assessment"]
    assert a["fits"] and a["max_safe_context"] == 40960 and a["kv_bytes_per_token"] == 256
    assert "path" not in by["other/Qwen3-Tiny"]
    add_to_hub_cache(hub[0] / "hf" / "hub", "late/Arrival", tiny_checkpoint("qwen3", seed=16))
    listed = httpx.get(srv.base_url + "/library").json()["models"]
    assert "late/Arrival" not in {r["repo_id"] for r in listed}
    fresh = httpx.get(srv.base_url + "/library", params={"refresh": 1}).json()["models"]
    assert "late/Arrival" in {r["repo_id"] for r in fresh}


def test_fit_and_admission_are_one_plan(srv):
    """/fit reports exactly what the engine's admission enforces (and /stats shows)."""
    fit_ = httpx.get(srv.base_url + "/fit", timeout=30).json()
    adm = httpx.get(srv.base_url + "/stats", timeout=30).json()["admission"]
    rep = fit_["report"]
    assert fit_["context_tokens"] == adm["enforced_context_tokens"]
    assert rep["max_safe_context"] == adm["max_safe_context"]
    assert rep["weights_bytes"] == adm["weights_bytes"]
    assert rep["kv_bytes_per_token"] == adm["kv_bytes_per_token"]
    assert rep["usable_bytes"] == adm["budget_bytes"] and rep["memory_budget_bytes"] is None


def test_explicit_memory_budget_reaches_fit(hub):
    """With --memory-budget, /fit's plan is the budgeted one admission enforces."""
    snap = hub[1]["other/Qwen3-Tiny"]
    weights = sum(v.nbytes for v in mx.load(str(snap / "model.safetensors")).values())
    budget = weights + 8_000_000
    s = start_server(snap, memory_budget_bytes=budget)
    try:
        rep = httpx.get(s.base_url + "/fit", timeout=30).json()["report"]
        adm = httpx.get(s.base_url + "/stats", timeout=30).json()["admission"]
    finally:
        s.stop()
    # 256 B/token of KV plus 6144 B/token of prefill scratch below one chunk
    hand = (budget - weights) // (256 + (1024 + 4 * 128) * 4)
    assert rep["max_safe_context"] == adm["max_safe_context"] == hand
    assert rep["memory_budget_bytes"] == budget and rep["total_bytes"] <= budget


def test_a_float32_kv_cache_is_named_float32_not_bf16():
    """A float32 checkpoint's cache (the embedded default on a CPU) is billed 4 bytes an
    element; `fit`, /fit and /stats name that dtype (they used to say "bf16")."""
    from mlxbun_core.library import checkpoint
    from mlxbun_core.library.report import fit_report, fit_text

    path = tiny_checkpoint("llama", seed=4, dtype="float32")
    config = checkpoint.read_json(path / "config.json")
    r = fit_report(config, checkpoint.weights(path), fit.machine(probe_mlx=False), context=100)
    assert r["report"]["kv_bytes_per_token"] == 2 * 2 * 16 * 2 * 4  # float32: 4 bytes
    assert r["kv_quant"] == "float32" and "(float32)" in fit_text("m", r)
    s = start_server(path)
    try:
        stats = httpx.get(s.base_url + "/stats", timeout=30).json()["kv_quant"]
        assert stats["mode"] == "float32" and stats["layers"] == {"float32": 2}
        assert httpx.get(s.base_url + "/fit", timeout=30).json()["kv_quant"] == "float32"
    finally:
        s.stop()
    bf16 = checkpoint.read_json(tiny_checkpoint("llama", seed=4) / "config.json")
    assert fit_report(bf16, checkpoint.weights(path), fit.machine(probe_mlx=False),
                      context=100)["kv_quant"] == "bfloat16"
