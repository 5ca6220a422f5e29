"""The batch's quantized block pool (``--kv-quant 4|8``) against mlx-lm itself: rows
joining and leaving a batch over quantized blocks decode exactly as mlx-lm's
``generate_step(..., kv_bits=b, kv_group_size=64, quantized_kv_start=0)`` decodes each
alone (float32 on the CPU), on a full-attention model, one with sliding windows (they
stay plain, as mlx-lm leaves them) and a hybrid with recurrent layers; drafts and forced
runs ride along; a row crosses to and from mlx-lm's own ``QuantizedKVCache``; the pool
bills what ``/fit`` bills and is empty again afterwards."""

from __future__ import annotations

import json
import random
import sys

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import (
    ArraysCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from mlxbun_core.engine.batch import BlockPool
from mlxbun_core.engine.batch.executor import Batch
from mlxbun_core.engine.batch.layout import layout
from mlxbun_core.kvquant import KVScheme
from mlxbun_core.library import fit
from mlxbun_core.testing.checkpoints import tiny_checkpoint

# head dims of 64 so the group of 64 divides them; Gemma's window of 8 is passed by
# every prompt but one
FAMILIES = {
    "llama": {"head_dim": 64},
    "gemma3_text": {"head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 8,
                    "sliding_window_pattern": 2},
    "qwen3_5": {"text_config": {"head_dim": 64}},
}
LENGTHS = [37, 5, 81, 1, 19]  # one prompt of a single token: its first pass is a decode step
BUDGETS = [12, 6, 12, 9, 4]  # rows leave at different steps
CHUNK = 7  # prompt tokens per prefill pass (mlx-lm's prefill_step_size in the references)
PROMPTS = [[5 + (i * 7 + j * 3) % 200 for j in range(n)] for i, n in enumerate(LENGTHS)]
_models: dict = {}


def checkpoint(family: str, **overrides):
    return tiny_checkpoint(family, seed=3, dtype="float32",
                           config_overrides=overrides or FAMILIES[family])


def model_of(family: str, **overrides):
    path = checkpoint(family, **overrides)
    if path not in _models:
        _models[path] = mlx_load(str(path))[0]
    return _models[path]


@pytest.fixture(autouse=True)
def lenient_mlx_lm(monkeypatch):
    """mlx-lm's kv_bits loop, minus its crash on sliding windows: its
    ``maybe_quantize_kv_cache`` calls ``RotatingKVCache.to_quantized``, which raises
    NotImplementedError; here those layers stay plain, as ours do."""
    gen = sys.modules["mlx_lm.generate"]
    original = gen.maybe_quantize_kv_cache

    def convert(cache, **kw):
        keep = [i for i, c in enumerate(cache) if not isinstance(c, RotatingKVCache)]
        part = [cache[i] for i in keep]
        original(part, **kw)
        for i, c in zip(keep, part):
            cache[i] = c

    monkeypatch.setattr(gen, "maybe_quantize_kv_cache", convert)


def reference(model, prompt: list, n: int, bits: int | None, cache=None) -> list:
    """``(token, logprob)`` of mlx-lm's greedy loop with ``kv_bits=bits``."""
    return [(int(t), lp[int(t)].item()) for t, lp in generate_step(
        mx.array(prompt), model, max_tokens=n, kv_bits=bits, kv_group_size=64,
        quantized_kv_start=0, prefill_step_size=CHUNK, prompt_cache=cache)]


def assert_same(got: list, want: list) -> None:
    """The same tokens; log-probs within 1e-4. The portable path attends over a row's
    blocks padded to whole blocks and to the longest row, so its sums run in another
    order than mlx-lm's over exactly the row's keys: a key that moves by a float32 ulp
    may land in the next quantization bin, which shows as up to a few 1e-5 in a log-prob
    (plain KV stays within 1e-5). Every real departure tried moved them 1e-3 or more."""
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-4)


def batch_of(model, bits: int) -> Batch:
    return Batch(model, layout(model), BlockPool(4, 8, 1000), kv=KVScheme(bits))


def staggered(b: Batch, prompts: list, budgets: list, decode=None, got=None) -> dict:
    """Add a row every third step, read prompts ``CHUNK`` tokens at a time (up to three
    at once), decode every step (``decode(b)``: a step of one's own), drop rows as they
    finish; every row's ``(token, logprob)`` (a forced token's logprob: None), in
    ``got`` if given."""
    got = {i: [] for i in range(len(prompts))} if got is None else got
    step = added = 0
    while added < len(prompts) or b.rows:
        if added < len(prompts) and step % 3 == 0:
            b.add(added, prompts[added], budget=budgets[added])
            added += 1
        if b.prefilling:
            b.prefill({u: CHUNK for u in b.prefilling[:3]})
        for e in (decode or Batch.decode)(b):
            got[e.uid] += [(e.token, e.logprobs[e.token].item()),
                           *((t, None) for t in e.forced)]
            if e.finish:
                b.remove(e.uid)
        step += 1
    return got


@pytest.mark.parametrize("family,bits", [("llama", 8), ("llama", 4), ("gemma3_text", 4),
                                         ("qwen3_5", 4)])
def test_rows_joining_and_leaving_equal_mlx_lm(family, bits):
    """Rows arrive while others read their prompts or decode and leave when done: each
    equals mlx-lm's quantized loop alone, token for token (the single-token prompt's
    first pass too, which runs apart from rows already holding quantized KV), and the
    pool is empty once they have left."""
    model = model_of(family)
    want = [reference(model, p, n, bits) for p, n in zip(PROMPTS, BUDGETS)]
    plain = [reference(model, p, n, None) for p, n in zip(PROMPTS, BUDGETS)]
    assert [[t for t, _ in w] for w in want] != [[t for t, _ in w] for w in plain], \
        "quantizing must change some tokens, or this test could not tell"
    b = batch_of(model, bits)
    got = staggered(b, PROMPTS, BUDGETS)
    for i, w in enumerate(want):
        assert_same(got[i], w)
    assert b.pool.used == 0 and not b.rows


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_drafts_and_forced_runs_over_quantized_blocks(family):
    """Windows of drafts (some wrong) and forced runs (the reference's own tokens) feed
    several positions in one pass over quantized blocks: every row still equals mlx-lm's
    one-token-at-a-time quantized loop."""
    model = model_of(family)
    n = 16
    want = [[t for t, _ in reference(model, p, n, 4)] for p in PROMPTS]
    rng = random.Random(0)
    got: dict = {i: [] for i in range(len(PROMPTS))}

    def drafting(b: Batch) -> list:
        drafts = {}
        for u in b.decoding:
            if b.pending(u) is None:
                continue
            at = len(got[u]) + 1  # the pending token is want[u][at - 1]
            d = want[u][at:at + rng.randint(0, 4)]
            if d and rng.random() < 0.4:
                d[rng.randrange(len(d))] ^= 1
            drafts[u] = d
        return b.decode(drafts=drafts)

    def forcing(uids: list, tokens: list) -> dict:
        out = {}
        for u, t in zip(uids, tokens):
            at = len(got[u])
            assert want[u][at] == t
            out[u] = want[u][at + 1:at + 1 + rng.randint(0, 3)]
        return out

    b = batch_of(model, 4)
    staggered(b, PROMPTS, [n] * len(PROMPTS), drafting, got)
    assert [[t for t, _ in g] for g in got.values()] == want
    assert b.pool.used == 0
    got = {i: [] for i in range(len(PROMPTS))}
    staggered(b, PROMPTS, [n] * len(PROMPTS), lambda b: b.decode(forcing=forcing), got)
    assert [[t for t, _ in g] for g in got.values()] == want
    assert any(lp is None for g in got.values() for _, lp in g), "no run was forced"
    assert b.pool.used == 0


def test_direct_attention_beside_quantized_blocks(monkeypatch):
    """Direct mode (the kernel's contract in plain ops on the CPU) under a scheme: the
    sliding layers, which stay plain, reach attention through the blocks while the full
    ones attend over their quantized triples, in the same passes; rows still equal
    mlx-lm's quantized loop."""
    from mlxbun_core.engine.batch import attention, direct

    monkeypatch.setattr(attention, "MODE", "reference")
    model = model_of("gemma3_text")
    want = [reference(model, p, n, 4) for p, n in zip(PROMPTS, BUDGETS)]
    b = batch_of(model, 4)
    assert direct.probe(b)
    calls: list = []
    real = attention.paged_reference
    monkeypatch.setattr(attention, "paged_reference",
                        lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    got = staggered(b, PROMPTS, BUDGETS)
    for i, w in enumerate(want):
        assert_same(got[i], w)
    assert calls and set(calls) == {8}  # the sliding layers' window: only they went direct
    assert b.pool.used == 0


def test_mtp_rows_over_quantized_blocks():
    """MTP rows (the tap hands each its hidden states) beside plain rows, arriving while
    others read their prompts: fresh rows run apart from rows holding quantized KV, every
    row still equals mlx-lm's quantized loop, and each MTP row's head was handed the
    states of its own positions (those of mlx-lm's quantized loop), whichever pass of a
    split step computed them."""
    from mlxbun_core.testing.mtp import BatchRun, CopyPredictor

    model = model_of("llama")
    rows = [(3 * i, p, n, 2 if i % 2 == 0 else None)
            for i, (p, n) in enumerate(zip(PROMPTS, BUDGETS))]
    run = BatchRun(model, CopyPredictor(model), rows, chunk=CHUNK, kv_bits=4)
    seen = _states_seen(run.mtp)
    run.run()
    for i, (_, p, n, depth) in enumerate(rows):
        assert run.out[i] == [t for t, _ in reference(model, p, n, 4)], i
        if depth:
            got, want = mx.concatenate(seen[i]), quantized_states(model, p + run.out[i], 4)
            assert got.shape == want.shape and mx.allclose(got, want, atol=1e-4).item(), i
    spec = [u.speculation for u in run.usage if u.speculation is not None]
    assert len(spec) == 3 and sum(s["drafted"] for s in spec) > 0
    assert run.batch.pool.used == 0 and run.mtp.pages.pool.used == 0


def _states_seen(tap) -> dict:
    """Record, per row, the hidden states ``tap`` is handed (``(positions, hidden)``
    arrays in position order)."""
    seen: dict = {}
    prompt, kept = tap.prompt, tap.kept

    def on_prompt(uids, hidden, after):
        for j, (u, a) in enumerate(zip(uids, after)):
            seen.setdefault(u, []).append(hidden[j, :len(a)])
        prompt(uids, hidden, after)

    def on_kept(uid, hidden, fed):
        seen.setdefault(uid, []).append(hidden[0])
        kept(uid, hidden, fed)

    tap.prompt, tap.kept = on_prompt, on_kept
    return seen


def quantized_states(model, tokens: list, bits: int) -> mx.array:
    """The target's hidden states at ``tokens`` as mlx-lm's ``kv_bits`` loop computes
    them: a first pass of ``CHUNK`` tokens over a fresh cache (full precision), then every
    position over the cache quantized after each call (a token a call: after the first
    pass, how positions are grouped into calls changes only the order of sums)."""
    from mlxbun_core.kvquant import quantize

    cache, scheme, out = make_prompt_cache(model), KVScheme(bits), []
    for part in [tokens[:CHUNK], *([t] for t in tokens[CHUNK:])]:
        out.append(model.model(mx.array([part]), cache=cache)[0])
        quantize(cache, scheme)
    return mx.concatenate(out)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5"])
def test_a_row_crosses_to_and_from_mlx_lms_quantized_cache(family):
    """A row exported mid-decode is mlx-lm's own cache kinds (``QuantizedKVCache`` for
    full attention, holding the codes mlx-lm's loop holds for those tokens, with scales
    and biases equal up to float rounding; sliding windows and recurrent state as they
    were); loaded into another batch it goes on as mlx-lm's loop does from that point."""
    model = model_of(family)
    prompt, n, k = PROMPTS[2], 12, 5
    ref_cache = make_prompt_cache(model)
    want = reference(model, prompt, n, 4, cache=ref_cache)
    b = batch_of(model, 4)
    b.add(0, prompt, budget=n)
    while b.prefilling:
        b.prefill({0: CHUNK})
    got: list = []
    while len(got) < k:
        got += [(e.token, e.logprobs[e.token].item()) for e in b.decode()]
    cache, held = b.export(0)
    kinds = {"llama": {QuantizedKVCache}, "gemma3_text": {RotatingKVCache, QuantizedKVCache},
             "qwen3_5": {ArraysCache, QuantizedKVCache}}[family]
    assert {type(c) for c in cache} == kinds == {type(c) for c in ref_cache}
    for mine, theirs in zip(cache, ref_cache):
        if isinstance(mine, QuantizedKVCache):
            assert mine.offset == len(held) and (mine.bits, mine.group_size) == (4, 64)
            for part, (a, c) in enumerate(zip([*mine.keys, *mine.values],
                                              [*theirs.keys, *theirs.values])):
                c = c[..., :len(held), :]
                if part % 3 == 0:  # the packed codes
                    assert mx.array_equal(a, c).item()
                else:  # scales and biases
                    assert mx.allclose(a, c, rtol=1e-5, atol=1e-6).item()
    pending = b.pending(0)  # sampled from the last pass, not yet fed nor handed out
    assert pending is not None
    token = int(pending[0].item())
    got.append((token, pending[1][token].item()))
    b.remove(0)
    assert b.pool.used == 0
    other = batch_of(model, 4)  # the row goes on elsewhere, from the exported cache
    other.add(1, [token], cache=cache, held=held, budget=n - len(got))
    while other.rows:
        for e in other.decode():
            got.append((e.token, e.logprobs[e.token].item()))
            if e.finish:
                other.remove(e.uid)
    assert_same(got, want)
    assert other.pool.used == 0


@pytest.mark.parametrize("bits", [8, 4])
def test_the_pool_bills_what_fit_bills(bits):
    """Bytes a position takes in the pool's quantized blocks (packed bits, a scale and a
    bias per group of 64) are fit's quantized bytes per token, to the byte."""
    model = model_of("llama")
    config = json.loads((checkpoint("llama") / "config.json").read_text())
    b = batch_of(model, bits)
    b.add(0, PROMPTS[0], budget=2)
    b.prefill({0: 64})
    per_token = b.layout.bytes_per_block() / b.pool.block_size
    assert per_token == fit.kv_layout(config, kv_bits=bits).bytes_per_token
    assert per_token < fit.kv_layout(config).bytes_per_token / (1.8 if bits == 8 else 3.2)
    b.close()
    assert b.pool.used == 0


def test_the_pools_limit_under_admission_is_whole_blocks():
    """Admission bills fractional bytes per token (a quantized scale per group); the
    pool's limit is still a whole number of blocks, and the pool grows up to it."""
    from types import SimpleNamespace

    from mlxbun_core.engine.batch import pool_for

    per_token = 2 * 2 * 64 * 2 * (0.5 + 4 / 64)  # kv4 on the tiny llama: 288.0
    admission = SimpleNamespace(layout=SimpleNamespace(bytes_per_token=per_token + 0.5),
                                kv_room=1_000_000)
    pool = pool_for(layout(model_of("llama")), admission)
    assert pool.limit == 1_000_000 // (289 * 16) + 64 and isinstance(pool.limit, int)
    pool.grow(pool.limit + 1)
    assert pool.capacity == pool.limit and pool.free == pool.limit - 1


def test_head_dims_the_group_cannot_split_stay_plain():
    """The family's own tiny head dims (16) do not divide into groups of 64: those
    layers keep their dtype, as the serial lane leaves them, so rows equal mlx-lm's
    plain loop, and a row leaves as a plain ``KVCache``."""
    model = model_of("llama", head_dim=16)
    want = [reference(model, p, n, None) for p, n in zip(PROMPTS, BUDGETS)]
    b = batch_of(model, 8)
    got = staggered(b, PROMPTS, BUDGETS)
    for i, w in enumerate(want):
        assert_same(got[i], w)
    b.add(9, PROMPTS[1], budget=4)
    b.prefill({9: CHUNK})
    assert {type(c) for c in b.export(9)[0]} == {KVCache}
    b.close()
    assert b.pool.used == 0
