"""The engine's own batch (``engine/batch/``) against mlx-lm's ``generate_step``.

Rows of different prompt lengths arrive at different steps, read their prompts in
chunks and decode together; every row's greedy tokens must equal mlx-lm's single-sequence
decode, float32 on the CPU, on each cache kind the batch pages or batches: full
attention (llama), sliding windows shorter than the prompts (gemma3), a recurrent hybrid
(qwen3_5) and a CacheList layer with a sparse-attention indexer (glm_moe_dsa). Windows
(forced runs, drafts), moving KV in and out of the pool, direct attention over blocks
and the pool's accounting are checked the same way. The pool ends empty every time.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxbun_core.engine.batch import attention, direct, flash
from mlxbun_core.engine.batch.entry import Shared
from mlxbun_core.engine.batch.executor import Batch
from mlxbun_core.engine.batch.layout import layout
from mlxbun_core.engine.batch.pool import BlockPool, BlockTable, OutOfBlocks
from mlxbun_core.testing.checkpoints import tiny_checkpoint

N = 10
LENGTHS = [37, 5, 81, 1, 19]
FAMILIES = {
    "llama": {},
    "gemma3_text": {"config_overrides": {"sliding_window": 8, "sliding_window_pattern": 2}},
    "qwen3_5": {},
    "glm_moe_dsa": {},
}
_models: dict = {}


def model_of(family: str):
    if family not in _models:
        _models[family] = load(str(tiny_checkpoint(family, seed=3, dtype="float32",
                                                   **FAMILIES[family])))[0]
    return _models[family]


def prompts() -> list[list[int]]:
    return [[5 + (i * 7 + j * 3) % 200 for j in range(n)] for i, n in enumerate(LENGTHS)]


def greedy(x: mx.array) -> mx.array:
    return mx.argmax(x, axis=-1)


def reference(model, prompt: list[int], n: int = N) -> list[int]:
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n,
                                             sampler=greedy)]


def batch_of(model, capacity: int = 8) -> Batch:
    return Batch(model, layout(model), BlockPool(4, capacity, 4096))


def drive(b: Batch, ps: list[list[int]], decode=None, every: int = 3,
          chunk: int = 7) -> dict[int, list[int]]:
    """Add row ``i`` at step ``every * i``; prefill ``chunk`` tokens of up to three
    rows a step; decode (``decode(b)`` instead of ``b.decode()``); the tokens."""
    got: dict[int, list[int]] = {i: [] for i in range(len(ps))}
    step = added = 0
    while any(len(g) < N for g in got.values()):
        if added < len(ps) and step % every == 0:
            b.add(added, ps[added], budget=N)
            added += 1
        if b.prefilling:
            b.prefill({u: chunk for u in b.prefilling[:3]})
        for e in (decode(b) if decode else b.decode()):
            got[e.uid] += [e.token, *e.forced]
            if e.finish:
                b.remove(e.uid)
        step += 1
        assert step < 200
    return got


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_arriving_apart_equal_mlx_lm(family):
    model = model_of(family)
    ps = prompts()
    b = batch_of(model)
    got = drive(b, ps)
    assert [got[i][:N] for i in range(len(ps))] == [reference(model, p) for p in ps]
    assert b.pool.used == 0 and not b.rows


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5"])
def test_forced_runs_ride_in_the_decode_window(family):
    """A forced run after a row's token (the reference's own next tokens, as a grammar
    that allows nothing else would force them) is fed in the same pass; rows with and
    without runs share it, and what comes out equals plain decoding."""
    model = model_of(family)
    ps = prompts()
    ref = [reference(model, p) for p in ps]
    rng = random.Random(0)
    seen: dict[int, int] = {}
    got_ref: dict[int, list[int]] = {}

    def forcing(uids, tokens):
        out = {}
        for u, t in zip(uids, tokens):
            at = seen.get(u, 0)
            assert ref[u][at] == t
            run = ref[u][at + 1:at + 1 + rng.randint(0, 4)]
            seen[u] = at + 1 + len(run)
            out[u] = run
        return out

    b = batch_of(model)
    got_ref = drive(b, ps, decode=lambda b: b.decode(forcing=forcing))
    assert [got_ref[i][:N] for i in range(len(ps))] == ref
    assert max(seen.values()) > 0 and b.pool.used == 0


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_drafts_are_verified_and_rejected_ones_dropped(family):
    """Drafts (some right, some wrong) ride after each row's next token; kept while they
    equal the row's own samples; the tokens equal plain decoding and fewer passes run."""
    model = model_of(family)
    ps = prompts()
    ref = [reference(model, p) for p in ps]
    rng = random.Random(1)
    counts = {"drafted": 0, "accepted": 0, "steps": 0}
    got: dict[int, list[int]] = {}

    def step(b):
        drafts = {}
        for u in b.decoding:
            if b.pending(u) is None:
                continue
            at = len(got.get(u, [])) + 1  # the pending token is ref[u][at - 1]
            d = list(ref[u][at:at + rng.randint(0, 4)])
            if d and rng.random() < 0.4:
                d[rng.randrange(len(d))] ^= 1
            drafts[u] = d
        counts["steps"] += 1
        out = b.decode(drafts=drafts)
        for e in out:
            got.setdefault(e.uid, []).append(e.token)
            counts["drafted"] += e.drafted
            counts["accepted"] += e.accepted
        return out

    b = batch_of(model)
    drive(b, ps, decode=step)
    assert [got[i][:N] for i in range(len(ps))] == ref
    assert 0 < counts["accepted"] < counts["drafted"]
    assert b.pool.used == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_leaves_the_pool_and_comes_back(family):
    """A row's KV exported as mlx-lm caches, loaded into a new row of another batch,
    continues exactly where mlx-lm's decode goes."""
    model = model_of(family)
    p = prompts()[2]
    ref = reference(model, p, 2 * N)
    b = batch_of(model)
    b.add(0, p, budget=2 * N)
    while b.prefilling:
        b.prefill({0: 16})
    out: list[int] = []
    while len(out) < 4:
        out += [e.token for e in b.decode()]
    cache, held = b.export(0)
    b.close()
    assert b.pool.used == 0
    g = len(held) - len(p)  # generated tokens the cache holds
    b2 = batch_of(model)
    b2.add(1, [ref[g]], cache=cache, held=held, budget=N)
    rest: list[int] = []
    while len(rest) < N - 1:
        rest += [e.token for e in b2.decode()]
    assert rest[:N - 1] == ref[g + 1:g + N]
    b2.close()
    assert b2.pool.used == 0


def test_a_shared_prefix_copies_nothing_and_a_divergent_write_copies_one_block():
    """Two rows start from one block entry: they hold the same blocks (nothing copied);
    each copies only the shared block it writes into, and both equal mlx-lm."""
    model = model_of("llama")
    base = prompts()[2][:30]  # 30 positions: 7 full blocks of 4 and a partial one
    b = batch_of(model)
    b.add(0, base + [9], budget=1)
    while b.prefilling:
        b.prefill({0: 64})
    entry, tokens = b.snapshot(0)
    b.remove(0)
    assert tokens == base and entry.length == 30
    used = b.pool.used
    tails = [[11, 12], [13]]
    for uid, tail in enumerate(tails, start=1):
        b.add(uid, tail, shared=Shared(*entry.share(30)), held=base, budget=N)
        assert b.pool.used == used  # shared: no new blocks yet
    got: dict[int, list[int]] = {1: [], 2: []}
    while any(len(v) < N for v in got.values()):
        if b.prefilling:
            b.prefill({u: 8 for u in b.prefilling})
        for e in b.decode():
            got[e.uid].append(e.token)
    for uid, tail in enumerate(tails, start=1):
        assert got[uid][:N] == reference(model, base + tail)
    b.close()
    entry.release()
    assert b.pool.used == 0


def test_blocks_are_counted_and_come_back():
    pool = BlockPool(4, 5, limit=7)  # block 0 is the trash block: 4 to hand out
    t = BlockTable(pool)
    assert len(t.reserve(10)) == 3 and pool.free == 1
    t.length = 10
    s = t.share(6)  # two blocks, the second partly
    assert pool.shared == 2 and s.cost(6, 8) == 1  # writing into the shared block copies it
    ((old, new),) = s.writable(6, 8)
    assert old == t.blocks[1] and new not in t.blocks and pool.shared == 1
    assert pool.free == 0
    with pytest.raises(OutOfBlocks):
        pool.allocate(1)
    pool.grow(7)
    assert pool.free == 2 and pool.room == 2
    s.free()
    t.free()
    assert pool.used == 0 and pool.shared == 0


def test_a_pass_builds_its_gather_indices_once_for_all_its_layers(monkeypatch):
    """The portable path reads the same blocks in every layer of a pass: the indices of
    the gather are built once per pass, not twice per layer (a 36-layer pass built about
    800 more graph nodes a step), and the tokens stay mlx-lm's."""
    from mlxbun_core.engine.batch import storage, view

    built = []

    def counted(*args):
        built.append(args)
        return storage_index(*args)

    storage_index = storage.gather_index
    monkeypatch.setattr(view, "gather_index", counted)
    monkeypatch.setattr(storage, "gather_index", counted)
    model = model_of("llama")
    assert len(model.layers) >= 2
    ps = prompts()[:3]
    b = batch_of(model)
    for i, p in enumerate(ps):
        b.add(i, p, budget=N)
    while b.prefilling:
        b.prefill({u: 128 for u in b.prefilling})
    built.clear()
    got: dict[int, list[int]] = {i: [] for i in range(len(ps))}
    for _ in range(N):
        for e in b.decode():
            got[e.uid].append(e.token)
    assert len(built) == N  # one a step, for all the layers and both keys and values
    assert [got[i] for i in range(len(ps))] == [reference(model, p)[:len(got[i])]
                                                for i, p in enumerate(ps)]
    assert all(len(g) == N - 1 for g in got.values())  # (the first step feeds the prompt's last)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5"])
def test_direct_attention_over_blocks_equals_mlx_lm(family, monkeypatch):
    """Direct mode (the kernel's contract in plain ops on the CPU): the probe lets the
    model in, every short pass reaches attention through the blocks, and the tokens
    equal mlx-lm's."""
    monkeypatch.setattr(attention, "MODE", "reference")
    model = model_of(family)
    b = batch_of(model)
    assert direct.probe(b)
    calls = []
    real = attention.paged_reference
    monkeypatch.setattr(attention, "paged_reference",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    ps = prompts()
    got = drive(b, ps)
    assert [got[i][:N] for i in range(len(ps))] == [reference(model, p) for p in ps]
    assert calls and b.pool.used == 0


def test_a_model_that_reshapes_its_keys_is_kept_off_direct_attention(monkeypatch):
    """glm_moe_dsa's layers are CacheLists (an indexer beside the attention): the probe
    says no and the batch stays on the gathered path."""
    monkeypatch.setattr(attention, "MODE", "reference")
    b = batch_of(model_of("glm_moe_dsa"))
    assert not direct.probe(b) and not b.direct


def test_the_probe_keeps_a_wrong_read_off_and_lets_bf16_rounding_in(monkeypatch):
    """The probe's bound is relative to the logits' spread: a direct path that attends
    the wrong row's positions is kept off, while the same tiny model in bfloat16, whose
    two summation orders round apart, is let in."""
    monkeypatch.setattr(attention, "MODE", "reference")
    real = attention.paged_reference
    monkeypatch.setattr(attention, "paged_reference",  # every row reads the next row's
                        lambda q, *a, **k: mx.roll(real(q, *a, **k), 1, axis=0))
    assert not direct.probe(batch_of(model_of("llama")))
    monkeypatch.setattr(attention, "paged_reference", real)
    half = load(str(tiny_checkpoint("llama", seed=3, dtype="bfloat16", **FAMILIES["llama"])))[0]
    assert direct.probe(batch_of(half))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_the_prefix_cache_keeps_rows_blocks_and_serves_them_back(family):
    """Rows that end leave their blocks in the prefix cache (no copy); later rows that
    share the prefix start from those blocks and answer exactly what a cold engine
    answers; once the cache lets go, the pool is empty."""
    from mlxbun_core.engine.core import Engine
    from mlxbun_core.testing.engine import close, run_all, token_ids

    path = str(tiny_checkpoint(family, seed=3))
    cached = Engine.load(path, progress=False, batch=8)
    cold = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0)
    history = "The sea and the sky meet at the edge of the world. " * 6
    first = [{"prompt": history + tail, "max_tokens": 6, "temperature": 0, "logprobs": True}
             for tail in ("Why?", "How far?")]
    # the next turns extend the first ones (what a model that cannot rewind can reuse)
    second = [{**body, "prompt": body["prompt"] + tail}
              for body, tail in zip(first, (" Where?", " When?"))]
    try:
        run_all(cached, first)  # batched together: both publish their blocks
        lane = cached.worker.lanes[0]
        kinds = {type(e.cache).__name__ for _, _, e in cached.prefix._entries()}
        assert "BlockEntry" in kinds
        hits = run_all(cached, second)
        want = run_all(cold, second)
        assert [token_ids(h) for h in hits] == [token_ids(w) for w in want]
        assert all(h.finish.usage.cached_tokens > 100 for h in hits)
        assert all(h.finish.usage.lane == "batched" for h in hits)
        cached.worker.run_sync(cached.prefix.clear)
        assert lane._batch.pool.used == 0
    finally:
        close(cached, cold)


def test_the_kernels_split_partials_combine_to_softmax_attention():
    """The CUDA kernel leaves per-split partials (max, sum, weighted values); the plain-ops
    combine must give the softmax over all keys, an empty split included."""
    mx.random.seed(0)
    length, dim, chunk = 700, 16, 256
    scores = mx.random.normal((length,)) * 3
    values = mx.random.normal((length, dim))
    want = (mx.softmax(scores)[:, None] * values).sum(axis=0)
    ms, ls, accs = [], [], []
    for s in range(4):  # 700 keys in splits of 256: the fourth is empty
        part, vals = scores[s * chunk:(s + 1) * chunk], values[s * chunk:(s + 1) * chunk]
        if part.size == 0:
            ms.append(mx.array(-mx.inf)), ls.append(mx.array(0.0)), accs.append(mx.zeros(dim))
            continue
        top = mx.max(part)
        e = mx.exp(part - top)
        ms.append(top), ls.append(e.sum()), accs.append((e[:, None] * vals).sum(axis=0))
    got = flash.combine(mx.stack(accs), mx.stack(ms), mx.stack(ls))
    assert float(mx.max(mx.abs(got - want))) < 1e-5
