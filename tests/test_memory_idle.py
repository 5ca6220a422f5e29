"""An idle server gives its memory back (``lanes/idle.py``): once the batch lane has had
no row and no queue for its idle delay (shortened here), the block pool's storage
shrinks to the blocks the prefix cache still holds, renumbered to the lowest ids, and
MLX's buffer cache is emptied; the next requests decode as mlx-lm's own greedy loop
does and the prefix cache's entries still hit. Under pressure while rows run, the
pool's free blocks at its top go back too.

Nothing here rests on timing: each load is stepped by hand with fixed prefill chunks
(the same rows, blocks and entries every run), the lane's idle delay stays long until
the test has read the pool it left, and the pool's holes are made by evicting the
oldest entries explicitly."""

from __future__ import annotations

import collections
import time

import mlx.core as mx

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.lanes.pace import FixedChunk
from mlxbun_core.engine.memory import MemoryConfig
from mlxbun_core.engine.readings import Reading
from mlxbun_core.metrics.engine import for_engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, lane_replies, pace, run_all, token_ids
from tests.test_memory_pressure import checkpoint, equal_to, prompt_ids, reference

IDLE_S = 0.2
NEVER_S = 3600.0  # the idle delay while a test still reads the pool a load left
BODIES = [greedy(" ".join(str((i * 7 + j) % 50) for j in range(60 + 25 * i)), 24)
          for i in range(6)]


def load(path=None, **kw) -> Engine:
    """An engine on ``path`` (the tiny llama) whose lane never rests until :func:`idle`
    shortens its delay, prefilling fixed chunks (no measured pacing)."""
    e = Engine.load(str(path or checkpoint("llama")), progress=False, batch=8,
                    memory=MemoryConfig(margin_bytes=0), **{"prompt_cache_bytes": 0, **kw})
    e.worker.lanes[0].idle_release_s = NEVER_S
    pace(e, FixedChunk(64))
    return e


def together(e: Engine, bodies: list[dict]) -> list:
    """``bodies`` run as one batch, stepped by hand on the worker (every body queued
    before the first step): the same schedule, block ids and prefix entries every run."""
    return lane_replies(e, bodies, [0] * len(bodies))


def idle(e: Engine, seconds: float = IDLE_S) -> None:
    """Set the lane's idle delay on the worker (its wait for the next message is then
    measured from the new delay)."""
    lane = e.worker.lanes[0]
    e.worker.run_sync(lambda: setattr(lane, "idle_release_s", seconds), timeout=60)


def evict_oldest(e: Engine, entries: int) -> None:
    """Evict the prefix cache's ``entries`` oldest block entries (the pool's public
    reclaim: one more free block each time takes exactly the oldest one)."""
    def run() -> None:
        layout = e.worker.lanes[0]._batch.layout
        for _ in range(entries):
            assert e.prefix.reclaim(layout, layout.pool.free + 1) == 1
    e.worker.run_sync(run, timeout=60)


def blocks(e: Engine) -> dict:
    return e.batch_stats()["kv_blocks"]


def released(e: Engine, count: int = 1, wait: float = 10.0) -> dict:
    """The pool's numbers once the lane gave memory back ``count`` times (failing after
    ``wait`` s)."""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        stats = blocks(e)
        if stats.get("idle_releases", 0) >= count:
            return stats
        time.sleep(0.05)
    raise AssertionError(f"no idle release within {wait} s: {blocks(e)}")


def consistent(e: Engine) -> None:
    """Every block the pool holds is held by prefix-cache entries exactly that often."""
    def check() -> None:
        batch = e.worker.lanes[0]._batch
        tables = e.prefix.block_tables(batch.layout) if e.prefix is not None else []
        held = collections.Counter(b for t in tables for b in t.blocks)
        pool = batch.pool
        assert all(pool.refs(b) == held[b] for b in range(1, pool.capacity))
        assert pool.used == len(held)

    e.worker.run_sync(check, timeout=60)


def test_an_idle_pool_and_mlx_cache_give_their_memory_back():
    """After a load ends, within the idle delay the pool's storage falls to one block and
    MLX's cache to nothing, once; the next load decodes as mlx-lm does."""
    path = checkpoint("llama")
    e = load()
    try:
        want = reference(path, prompt_ids(e, BODIES), 24)
        equal_to(together(e, BODIES), want)
        busy = blocks(e)
        assert busy["bytes"] >= 20 * busy["bytes_per_block"] and mx.get_cache_memory() > 0
        assert busy["idle_releases"] == 0, busy
        t0 = time.monotonic()
        idle(e)
        got = released(e)
        assert time.monotonic() - t0 < IDLE_S + 5
        assert got["bytes"] == got["bytes_per_block"] and got["used"] == 0, got
        assert got["released_bytes"] == busy["bytes"] - got["bytes"]
        assert mx.get_cache_memory() == 0
        samples = {s.name: s.value for m in for_engine(e).collect() for s in m.samples}
        assert samples["mlxbun_kv_pool_releases_total"] == 1
        assert samples["mlxbun_kv_pool_released_bytes_total"] == got["released_bytes"]
        time.sleep(3 * IDLE_S)
        assert blocks(e)["idle_releases"] == 1  # once per idle spell
        equal_to(run_all(e, BODIES), want)
        assert released(e, 2)["idle_releases"] == 2
    finally:
        close(e)


def test_prefix_entries_survive_the_release_and_still_hit():
    """The prefix cache's oldest entries evicted leave their blocks as holes under the
    kept ones: the release renumbers the kept blocks to the lowest ids and cuts the
    storage to them; the same prompts then hit and decode as a cold mlx-lm run."""
    path = checkpoint("llama")
    e = load(prompt_cache_bytes=1 << 30)
    try:
        want = reference(path, prompt_ids(e, BODIES), 24)
        equal_to(together(e, BODIES), want)
        evict_oldest(e, 2)
        before = e.worker.run_sync(lambda: _held_ids(e), timeout=60)
        assert before and max(before) > len(before), f"the test needs holes: {before}"
        assert blocks(e)["idle_releases"] == 0
        idle(e)
        got = released(e)
        consistent(e)
        assert got["capacity"] == got["used"] == len(before), got
        assert e.worker.run_sync(lambda: _held_ids(e), timeout=60) == \
            list(range(1, len(before) + 1))
        hits = e.prefix.stats()["hits"]
        again = run_all(e, BODIES)
        equal_to(again, want)
        assert e.prefix.stats()["hits"] > hits
        assert sum(r.finish.usage.cached_tokens for r in again) >= 16
    finally:
        close(e)


def _held_ids(e: Engine) -> list[int]:
    pool = e.worker.lanes[0]._batch.pool
    return [b for b in range(1, pool.capacity) if pool.refs(b) > 0]


def test_a_busy_pool_short_of_memory_gives_its_free_top_back():
    """A pool grown by a load, then memory short (the reading: a few blocks free) while
    one request runs: the free blocks above what it takes go back; its reply is still
    mlx-lm's, and the pool holds nothing after."""
    path = checkpoint("llama")
    e = load()  # (its idle delay stays long: no idle release here)
    try:
        equal_to(together(e, BODIES), reference(path, prompt_ids(e, BODIES), 24))
        grown = blocks(e)
        assert grown["capacity"] >= 40, grown
        e.memory.probe = lambda: Reading(4 * grown["bytes_per_block"], 0, "test")
        e.memory.available(fresh=True)
        one = [greedy("a b c d e f", 20)]
        equal_to(run_all(e, one), reference(path, prompt_ids(e, one), 20))
        after = blocks(e)
        assert after["pressure_trims"] == 1 and after["idle_releases"] == 0, after
        assert after["capacity"] <= 4 and after["bytes"] < grown["bytes"], after
    finally:
        close(e)


def test_quantized_blocks_compact_and_decode_as_before():
    """Under ``--kv-quant`` (quantized blocks: packed keys, scales and biases) the kept
    entries move down with their storage: each holds the same bytes after the release,
    and the same prompts then hit and decode token for token as on a twin engine that
    ran the same schedule without a release (quantized tokens depend on prefill chunking,
    so the twin, not mlx-lm's loop, is the reference)."""
    path = tiny_checkpoint("llama", seed=3, dtype="float32", config_overrides={"head_dim": 64})
    e, twin = (load(path, kv_quant="4", prompt_cache_bytes=1 << 30) for _ in range(2))
    try:
        for engine in (e, twin):
            together(engine, BODIES)
            evict_oldest(engine, 2)
        busy = blocks(e)
        before = e.worker.run_sync(lambda: _held_ids(e), timeout=60)
        assert before and max(before) > len(before), f"the test needs holes: {before}"
        kept = _stored(e)
        assert kept and all(kept.values()), "the entries hold no KV"
        idle(e)
        got = released(e)
        consistent(e)
        assert got["kv_quant"] == "4" and 0 < got["bytes"] < busy["bytes"], (busy, got)
        assert got["capacity"] == got["used"] == len(before), got
        assert _stored(e) == kept
        again, want = together(e, BODIES), together(twin, BODIES)
        assert blocks(twin)["idle_releases"] == 0
        assert [token_ids(r) for r in again] == [token_ids(r) for r in want]
        cached = [r.finish.usage.cached_tokens for r in again]
        assert cached == [r.finish.usage.cached_tokens for r in want] and sum(cached) >= 16
    finally:
        close(e, twin)


def _stored(e: Engine) -> dict:
    """Every prefix entry's KV as bytes, by its tokens (read on the worker)."""
    def read() -> dict:
        return {tuple(tokens): [bytes(memoryview(a)) for c in caches for a in _arrays(c.state)]
                for _, tokens, caches in e.prefix.entries()}
    out: dict = e.worker.run_sync(read, timeout=60)
    return out


def _arrays(state) -> list:
    if isinstance(state, (list, tuple)):
        return [a for s in state for a in _arrays(s)]
    return [state] if isinstance(state, mx.array) else []
