"""KV quantization (``--kv-quant 4|8``): greedy tokens and log-probs equal mlx-lm's
``generate_step(..., kv_bits=b, quantized_kv_start=0)`` on every lane (a lone stream,
batched rows, the serial lane) and on every cache kind (full attention, Gemma's sliding
windows, Qwen3.5's recurrent state, GLM's latent cache); fit's bytes against what the
caches hold; the prefix cache with quantized entries. The batch's quantized block pool
itself is tested against mlx-lm in ``test_kvquant_pool.py``."""

from __future__ import annotations

import json
import sys

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache, make_prompt_cache

from mlxbun_core import kvquant
from mlxbun_core.engine.core import Engine
from mlxbun_core.library import fit
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, lane_replies, token_ids

# head dims of 64, so that the group of 64 divides them (the families' tiny configs use
# 16/32, which no group of 64 can quantize: those stay in their dtype, tested below)
DIMS = {
    "llama": {"head_dim": 64},
    "gemma3_text": {"head_dim": 64, "query_pre_attn_scalar": 64},
    "gemma4": {"text_config": {"head_dim": 64, "global_head_dim": 64}},
    "qwen3_5": {"text_config": {"head_dim": 64}},
    "glm_moe_dsa": {},  # a latent (MLA) cache: mlx-lm quantizes none of it
}
PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog and then", "Hi"]
N = 12


def family_ckpt(family: str):
    return tiny_checkpoint(family, seed=0, config_overrides=DIMS[family])


@pytest.fixture
def lenient_mlx_lm(monkeypatch):
    """mlx-lm's kv_bits loop, minus its crash on sliding windows: its
    ``maybe_quantize_kv_cache`` calls ``RotatingKVCache.to_quantized``, which raises
    NotImplementedError; here those layers stay bf16, as ours do."""
    gen = sys.modules["mlx_lm.generate"]
    original = gen.maybe_quantize_kv_cache

    def convert(cache, **kw):
        keep = [i for i, c in enumerate(cache) if not isinstance(c, RotatingKVCache)]
        part = [cache[i] for i in keep]
        original(part, **kw)
        for i, c in zip(keep, part):
            cache[i] = c

    monkeypatch.setattr(gen, "maybe_quantize_kv_cache", convert)


def reference(ref, text: str, bits, n: int = N, prompt_cache=None) -> tuple[list, list]:
    """Tokens and chosen-token log-probs from mlx-lm's generate_step (greedy, kv_bits)."""
    model, tok = ref
    ids, lps = [], []
    for t, lp in generate_step(mx.array(tok.encode(text)), model, max_tokens=n, kv_bits=bits,
                               quantized_kv_start=0, prompt_cache=prompt_cache):
        ids.append(int(t))
        lps.append(lp[int(t)].item())
        if int(t) in tok.eos_token_ids:
            break
    return ids, lps


def drive(engine: Engine, bodies: list, join_after: int = 0) -> list:
    """On the worker thread: add ``bodies[0]``, step the first lane ``join_after`` times,
    add the rest at once, step until all end; the replies (all added together when 0)."""
    def on_step(n, jobs, lane):
        if n == join_after:
            assert lane.alone, "the first job must be decoding alone"

    return lane_replies(engine, bodies, [0] + [join_after] * (len(bodies) - 1), on_step)


def logprobs(reply) -> list:
    return [e["logprob"] for e in reply.finish.logprobs]


def assert_same(reply, want: tuple) -> None:
    ids, lps = want
    assert token_ids(reply) == ids
    assert logprobs(reply) == pytest.approx(lps, abs=1e-5)


# ---------------------------------------------------------------- lanes

@pytest.fixture(scope="module")
def llama():
    return str(family_ckpt("llama")), mlx_load(str(family_ckpt("llama")))


@pytest.mark.parametrize("bits", [8, 4])
def test_every_lane_equals_mlx_lm_kv_bits(llama, bits):
    """A lone stream (solo), rows batched together (different prompt lengths: padding),
    and the serial lane all decode exactly as mlx-lm's quantized single-sequence loop."""
    path, ref = llama
    want = [reference(ref, p, bits) for p in PROMPTS]
    assert want[0][0] != reference(ref, PROMPTS[0], None)[0], "kv_bits must change the tokens"
    batched = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0, kv_quant=str(bits))
    serial = Engine.load(path, progress=False, batch=1, prompt_cache_bytes=0, kv_quant=str(bits))
    try:
        lone = drive(batched, [greedy(PROMPTS[0], N)])[0]
        assert lone.finish.usage.lane == "batched"
        assert_same(lone, want[0])
        rows = drive(batched, [greedy(p, N) for p in PROMPTS])
        for reply, w in zip(rows, want):
            assert_same(reply, w)
        for reply, w in zip(drive(serial, [greedy(p, N) for p in PROMPTS]), want):
            assert reply.finish.usage.lane == "serial"
            assert_same(reply, w)
    finally:
        close(batched, serial)


def test_a_lone_stream_joins_the_batch_with_its_quantized_kv(llama):
    """The lone stream's quantized KV moves into the batch's blocks unchanged: its tokens
    stay mlx-lm's. The newcomer's first chunk runs in a pass of its own, in full
    precision as mlx-lm's first pass over a fresh cache, so it equals mlx-lm's loop from
    the start too (not mlx-lm's loop started on an empty quantized cache)."""
    path, ref = llama
    engine = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0, kv_quant="8")
    try:
        first, second = drive(engine, [greedy(PROMPTS[0], N), greedy(PROMPTS[1], N)],
                              join_after=4)
        assert first.finish.usage.lane == second.finish.usage.lane == "batched"
        assert_same(first, reference(ref, PROMPTS[0], 8))
        assert_same(second, reference(ref, PROMPTS[1], 8))
        empty = [c.to_quantized(group_size=64, bits=8) for c in make_prompt_cache(ref[0])]
        assert reference(ref, PROMPTS[1], 8, prompt_cache=empty) != \
            reference(ref, PROMPTS[1], 8), "the first pass's precision must show"
    finally:
        close(engine)


def test_speculative_decoding_quantizes_like_mlx_lm(llama):
    """With a draft model mounted (the serial lane's speculative loop) both caches are
    quantized, as ``speculative_generate_step(..., kv_bits=8)`` quantizes them: the same
    tokens and as many drafts accepted (the draft is the model itself)."""
    from mlx_lm.generate import speculative_generate_step

    from mlxbun_core.model import LoadOptions

    path, (model, tok) = llama
    want, accepted = [], 0
    for t, _, from_draft in speculative_generate_step(
            mx.array(tok.encode(PROMPTS[0])), model, model, num_draft_tokens=3, max_tokens=N,
            kv_bits=8, quantized_kv_start=0):
        want.append(int(t))
        accepted += from_draft
        if int(t) in tok.eos_token_ids:
            break
    engine = Engine.load(path, LoadOptions(extra={"draft_model": path, "num_draft_tokens": 3}),
                         progress=False, kv_quant="8")
    try:
        reply = drive(engine, [greedy(PROMPTS[0], N)])[0]
        assert reply.finish.usage.lane == "serial+spec"
        assert token_ids(reply) == want != reference((model, tok), PROMPTS[0], None)[0]
        assert reply.finish.usage.speculation["accepted"] == accepted
    finally:
        close(engine)


@pytest.mark.parametrize("family", ["gemma3_text", "gemma4", "qwen3_5", "glm_moe_dsa"])
def test_every_cache_kind_equals_mlx_lm(family, lenient_mlx_lm, caplog):
    """Sliding windows stay bf16 (one start-up warning), recurrent state is untouched,
    latent caches are left alone; what can be quantized is, and tokens equal mlx-lm's."""
    path = str(family_ckpt(family))
    ref = mlx_load(path)
    caplog.set_level("WARNING", logger="mlxbun.engine")
    engine = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=1 << 30,
                         kv_quant="8")
    try:
        layers = engine.kv_quant_stats()["layers"]
        warnings = [r.getMessage() for r in caplog.records if "--kv-quant" in r.getMessage()]
        native = fit.activation_dtype(engine.model.config)  # what unquantized layers hold
        expect = {"gemma3_text": ({"kv8": 1, native: 1}, "1 sliding-window"),
                  "gemma4": ({"kv8": 1, native: 1}, "1 sliding-window"),
                  "qwen3_5": ({"kv8": 1, native: 0, "recurrent": 1}, None),
                  "glm_moe_dsa": ({"kv8": 0, native: 2}, "2 full-attention")}[family]
        assert layers == expect[0]
        assert (len(warnings), expect[1] is None or expect[1] in warnings[0]) == \
            (0 if expect[1] is None else 1, True)
        rows = drive(engine, [greedy(p, N) for p in PROMPTS[:2]])
        for reply, p in zip(rows, PROMPTS[:2]):
            assert_same(reply, reference(ref, p, 8))
        kinds = {type(c).__name__ for c in _entries(engine)[0][1]}
        quantized = {"gemma3_text": {"RotatingKVCache", "QuantizedKVCache"},
                     "gemma4": {"RotatingKVCache", "QuantizedKVCache"},
                     "qwen3_5": {"ArraysCache", "QuantizedKVCache"},
                     "glm_moe_dsa": {"CacheList"}}[family]
        assert kinds == quantized
    finally:
        close(engine)


# ---------------------------------------------------------------- the prefix cache

def _entries(engine) -> list:
    """(tokens, cache) of every entry in the engine's prefix cache, once the worker has
    finished the step that ended the last request (a lane publishes after its Done); read
    on the worker, the MLX thread (block entries are read out of the batch's pool)."""
    return engine.worker.run_sync(
        lambda: [(tokens, cache) for _, tokens, cache in engine.prefix.entries()])


def _held_bytes(cache) -> int:
    """Bytes a cache holds for its tokens (not its preallocated tail)."""
    total = 0
    for c in cache:
        arrays = (c.keys + c.values) if isinstance(c, QuantizedKVCache) else (c.keys, c.values)
        total += sum(a.nbytes // a.shape[2] * c.offset for a in arrays)
    return total


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5"])
def test_a_prefix_hit_continues_from_the_quantized_entry(family, lenient_mlx_lm):
    """The next turn (the first prompt, then new text) trims the quantized entry of the
    first turn's prompt and reply back to the shared prefix (or, for recurrent state,
    takes the prompt-boundary snapshot) and decodes exactly as mlx-lm's kv_bits loop does
    from that cache; the byte count is the quantized entries' own."""
    path = str(family_ckpt(family))
    model, tok = mlx_load(path)
    engine = Engine.load(path, progress=False, batch=8, kv_quant="8")
    try:
        head = "The sea and the sky were grey that morning, " * 6
        drive(engine, [greedy(head, N)])
        body = greedy(head + "so we walked along the shore.", N)
        req = engine.parse_completion(body)
        prompt = tok.encode(body["prompt"])
        longest = max(len(tokens) for tokens, _ in _entries(engine))
        cache, n = engine.worker.run_sync(
            lambda: engine.prefix.lookup(engine.cache_namespace(req), prompt))
        if family == "qwen3_5":  # recurrent state: the first prompt's boundary snapshot
            assert n == len(tok.encode(head)) - 1
        else:  # the entry of prompt and reply, trimmed back to the shared prefix
            assert len(tok.encode(head)) - 1 <= n < longest
        assert any(isinstance(c, QuantizedKVCache) for c in cache)
        ids, lps = [], []
        for t, lp in generate_step(mx.array(prompt[n:]), model, max_tokens=N, kv_bits=8,
                                   quantized_kv_start=0, prompt_cache=cache):
            ids.append(int(t))
            lps.append(lp[int(t)].item())
            if int(t) in tok.eos_token_ids:
                break
        reply = drive(engine, [body])[0]
        assert reply.finish.usage.cached_tokens == n
        assert_same(reply, (ids, lps))
        stats = engine.prefix.stats()
        assert stats["bytes"] == sum(c.nbytes for _, e in _entries(engine) for c in e) > 0
    finally:
        close(engine)


def test_quantized_and_plain_kv_never_share_a_namespace(llama):
    path, _ = llama
    engines = {q: Engine.load(path, progress=False, kv_quant=q) for q in ("off", "8", "4")}
    try:
        req = engines["off"].parse_completion(greedy("hello"))
        names = {q: e.cache_namespace(req) for q, e in engines.items()}
        assert len(set(names.values())) == 3
        assert names["off"][3] == "kv:native" and names["8"][3] == "kv:affine8:g64"
    finally:
        close(*engines.values())


# ---------------------------------------------------------------- bytes

@pytest.mark.parametrize("dims", [True, False], ids=["head64", "tiny-dims"])
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gemma4", "qwen3_5", "glm_moe_dsa"])
def test_fit_bills_what_the_quantized_cache_holds(family, dims):
    """After a 512-token prefill (whole 256-slabs, so nbytes has no spare tail) the caches'
    nbytes equal fit's bytes at 512 tokens for 8 and 4 bits; with the families' tiny head
    dims (16/32, no group of 64 fits) nothing is quantized and fit bills bf16."""
    from mlx_lm.utils import load_model

    path = tiny_checkpoint(family, seed=0, config_overrides=DIMS[family] if dims else {})
    config = json.loads((path / "config.json").read_text())
    model, _ = load_model(path)
    for bits in (8, 4):
        cache = make_prompt_cache(model)
        kvquant.QuantizingModel(model, kvquant.KVScheme(bits))(mx.array([[5] * 512]),
                                                               cache=cache)
        mx.eval([c.state for c in cache])
        layout = fit.kv_layout(config, kv_bits=bits)
        assert sum(c.nbytes for c in cache) == layout.bytes_at(512)
        assert layout.quantized_layers == sum(isinstance(c, QuantizedKVCache) for c in cache)
        if layout.quantized_layers:
            assert layout.bytes_per_token < fit.kv_layout(config).bytes_per_token


def test_quantized_bytes_per_token_by_hand():
    llama_8b = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "torch_dtype": "bfloat16"}
    per_elem = 32 * 8 * 128 * 2  # layers x KV heads x head dim x (K, V)
    assert fit.kv_bytes_per_token(llama_8b) == per_elem * 2
    # packed bits, plus a bf16 scale and bias per group of 64
    assert fit.kv_bytes_per_token(llama_8b, kv_bits=8) == per_elem * (1 + 4 / 64)
    assert fit.kv_bytes_per_token(llama_8b, kv_bits=4) == per_elem * (0.5 + 4 / 64)
    gemma = {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
             "head_dim": 256, "sliding_window": 1024, "sliding_window_pattern": 6}
    kv = fit.kv_layout(gemma, kv_bits=8)
    # the sliding layers keep bf16 (mlx-lm cannot quantize a rotating cache)
    assert kv.bytes_at(10_000) == 4 * 256 * 2 * (1 + 4 / 64) * 10_000 + 5 * 4 * 256 * 2 * 2 * 1024
    assert kv.quantized_layers == 1
    budget, weights = 24_000_000_000, 16_000_000_000
    plain = fit.plan({**llama_8b, "vocab_size": 128256, "intermediate_size": 14336},
                     weights, budget)
    kv8 = fit.plan({**llama_8b, "vocab_size": 128256, "intermediate_size": 14336},
                   weights, budget, kv_bits=8)
    assert kv8.max_safe_context > 1.8 * plain.max_safe_context


# ---------------------------------------------------------------- the scheme

def test_parse_and_names():
    assert kvquant.parse("off") is kvquant.OFF and kvquant.parse(None) is kvquant.OFF
    assert kvquant.parse("8") == kvquant.KVScheme(8) and kvquant.parse(4).mode() == "uniform-kv4"
    assert kvquant.OFF.mode("float32") == "float32"  # off: the dtype the cache holds
    with pytest.raises(ValueError, match="--kv-quant"):
        kvquant.parse("3")


# ---------------------------------------------------------------- the server

def test_server_reports_and_bills_the_quantized_cache(llama):
    """/stats kv_quant names the scheme and the layers; /fit and admission bill 544 B per
    token (2 layers x 2 KV heads x 64 x (K, V) x (1 + 4/64)), so max_safe_context under a
    budget grows; the prefix-cache entry of a served request holds exactly what /fit
    reports for its length."""
    import httpx
    import openai

    from mlxbun_core.testing.server import start_server

    path, _ = llama
    weights = sum(v.nbytes for v in mx.load(path + "/model.safetensors").values())
    budget = weights + 8_000_000
    srv = start_server(path, kv_quant="8", memory_budget_bytes=budget)
    try:
        stats = httpx.get(srv.base_url + "/stats", timeout=30).json()
        assert stats["kv_quant"] == {
            "mode": "uniform-kv8", "bits": 8, "group_size": 64, "quantized_kv_start": 0,
            "layers": {"kv8": 2, "bfloat16": 0}, "attention": {"global": 2, "sliding_window": 0}}
        per_token = 2 * 2 * 64 * 2 * (1 + 4 / 64)
        fit_ = httpx.get(srv.base_url + "/fit", timeout=30).json()
        assert fit_["kv_quant"] == "uniform-kv8"
        assert fit_["report"]["kv_bytes_per_token"] == per_token == 544
        assert stats["admission"]["kv_bytes_per_token"] == per_token
        scratch = (1024 + 4 * 128) * 4  # prefill transient per token below one chunk
        assert stats["admission"]["max_safe_context"] == (budget - weights) // (544 + scratch)
        assert (budget - weights) // (544 + scratch) > (budget - weights) // (1024 + scratch)

        client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
        client.completions.create(model="m", prompt="Once upon a time " * 20, max_tokens=8,
                                  temperature=0)
        (tokens, cache), = _entries(srv.engine)
        assert all(isinstance(c, QuantizedKVCache) for c in cache)
        at = httpx.get(srv.base_url + "/fit", params={"ctx": len(tokens)}, timeout=30).json()
        assert _held_bytes(cache) == at["report"]["kv_bytes"] == 544 * len(tokens)
    finally:
        srv.stop()


@pytest.mark.parametrize("kv,per_token", [("8", 544), ("4", 2 * 2 * 64 * 2 * (0.5 + 4 / 64)),
                                           ("off", 1024)])
def test_the_batch_pool_reports_what_its_blocks_take(llama, kv, per_token):
    """``/stats`` ``batch.kv_blocks``: after two rows ran batched, the pool's blocks take
    what admission and ``/fit`` bill per token (quantized blocks under a scheme), and
    every block is free again once the rows have ended."""
    path, _ = llama
    engine = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0, kv_quant=kv)
    try:
        assert engine.batch_stats()["kv_blocks"] is None  # no batch yet
        rows = drive(engine, [greedy(p, N) for p in PROMPTS[:2]])
        assert {r.finish.usage.lane for r in rows} == {"batched"}
        engine.worker.run_sync(lambda: None)
        pool = engine.batch_stats()["kv_blocks"]
        assert pool["bytes_per_token"] == per_token
        assert pool["bytes_per_token"] == engine.admission.stats()["kv_bytes_per_token"]
        assert pool["bytes_per_block"] == per_token * pool["block_size"]
        assert pool["bytes"] == pool["bytes_per_block"] * pool["capacity"]
        assert pool["used"] == 0 and pool["kv_quant"] == kv
    finally:
        close(engine)


def test_fit_command_bills_the_scheme(llama, capsys):
    from mlxbun_core.cli import main

    path, _ = llama
    reports = {}
    for flags in (["--kv-quant", "8"], ["--kv-bits", "4"], []):
        assert main(["fit", path, "--json", *flags]) == 0
        reports[tuple(flags)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    per = {k: (r["kv_quant"], r["report"]["kv_bytes_per_token"]) for k, r in reports.items()}
    assert per == {("--kv-quant", "8"): ("uniform-kv8", 544),
                   ("--kv-bits", "4"): ("uniform-kv4", 2 * 2 * 64 * 2 * (0.5 + 4 / 64)),
                   (): ("bfloat16", 1024)}


# ---------------------------------------------------------------- the start-up kernel check

def test_the_kernel_check_runs_mlx_lm_attention_at_the_models_shape(llama):
    """The probe calls mlx-lm's quantized attention with the model's grouped-query heads
    at decode and prefill lengths, and passes on this backend."""
    from mlxbun_core.kvquant.probe import KEY_LENGTHS, QUERY_LENGTHS, check_kernels

    path, (model, _) = llama
    config = json.loads((family_ckpt("llama") / "config.json").read_text())
    seen = []

    def attention(q, qk, qv, **kw):
        from mlx_lm.models.base import quantized_scaled_dot_product_attention

        seen.append((q.shape[1], qk[0].shape[1], q.shape[2], qk[0].shape[2], kw["bits"]))
        return quantized_scaled_dot_product_attention(q, qk, qv, **kw)

    check_kernels(8, 64, config, attention=attention)
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    assert sorted(seen) == sorted((heads, kv_heads, q, k, 8)
                                  for q in QUERY_LENGTHS for k in KEY_LENGTHS)


def test_a_missing_quantized_kernel_is_a_start_up_error(llama, monkeypatch, capsys):
    """Where MLX lacks a quantized-attention kernel for the model (seen on CUDA), `serve
    --kv-quant` stops at start-up with the shape and the fix, exit 2, not a 500 later."""
    import mlx_lm.models.base as base

    from mlxbun_core.cli import main

    def missing(*a, **kw):
        raise RuntimeError("[quantized_matmul] No implementation for problem shape")

    monkeypatch.setattr(base, "quantized_scaled_dot_product_attention", missing)
    path, _ = llama
    assert main(["serve", path, "--kv-quant", "4", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--kv-quant 4" in err and "No implementation for problem shape" in err
    assert "Serve without --kv-quant" in err
