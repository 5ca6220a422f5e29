"""An idle server gives its memory back (``lanes/idle.py``): once the batch lane has had
no row and no queue for its idle delay (shortened here), the block pool's storage
shrinks to the blocks the prefix cache still holds, renumbered to the lowest ids, and
MLX's buffer cache is emptied; the next requests decode as mlx-lm's own greedy loop
does and the prefix cache's entries still hit. Under pressure while rows run, the
pool's free blocks at its top go back too."""

from __future__ import annotations

import collections
import time

import mlx.core as mx

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.memory import MemoryConfig, Reading
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, run_all, settled
from tests.test_memory_pressure import checkpoint, equal_to, prompt_ids, reference

IDLE_S = 0.2
BODIES = [greedy(" ".join(str((i * 7 + j) % 50) for j in range(60 + 25 * i)), 24)
          for i in range(6)]


def load(prefix_bytes: int = 0) -> Engine:
    e = Engine.load(str(checkpoint("llama")), progress=False, batch=8,
                    prompt_cache_bytes=prefix_bytes, memory=MemoryConfig(margin_bytes=0))
    e.worker.lanes[0].idle_release_s = IDLE_S
    return e


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
        equal_to(run_all(e, BODIES), want)
        settled(e)
        busy = blocks(e)
        assert busy["bytes"] >= 20 * busy["bytes_per_block"] and mx.get_cache_memory() > 0
        t0 = time.monotonic()
        idle = released(e)
        assert time.monotonic() - t0 < IDLE_S + 5
        assert idle["bytes"] == idle["bytes_per_block"] and idle["used"] == 0, idle
        assert idle["released_bytes"] == busy["bytes"] - idle["bytes"]
        assert mx.get_cache_memory() == 0
        time.sleep(3 * IDLE_S)
        assert blocks(e)["idle_releases"] == 1  # once per idle spell
        equal_to(run_all(e, BODIES), want)
        assert released(e, 2)["idle_releases"] == 2
    finally:
        close(e)


def test_prefix_entries_survive_the_release_and_still_hit():
    """A prefix cache small enough to evict some of a load's entries leaves their blocks
    as holes under the kept ones: the release renumbers the kept blocks to the lowest
    ids and cuts the storage to them; the same prompts then hit and decode as a cold
    mlx-lm run."""
    path = checkpoint("llama")
    e = load(prefix_bytes=1 << 30)
    per_block = 16 * int(e.admission.layout.bytes_per_token)
    e.prefix.max_bytes = 40 * per_block  # (the pool's limit came from the cap: none here)
    try:
        want = reference(path, prompt_ids(e, BODIES), 24)
        equal_to(run_all(e, BODIES), want)
        settled(e)
        before = e.worker.run_sync(lambda: _held_ids(e), timeout=60)
        assert before and max(before) > len(before), "the test needs holes in the pool"
        idle = released(e)
        consistent(e)
        assert idle["capacity"] == idle["used"] == len(before), idle
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
    e = load()
    lane = e.worker.lanes[0]
    lane.idle_release_s = 3600.0  # (no idle release here)
    try:
        equal_to(run_all(e, BODIES), reference(path, prompt_ids(e, BODIES), 24))
        settled(e)
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
    entries move down with their storage: the same prompts after the release hit and
    give the replies they gave before it."""
    path = tiny_checkpoint("llama", seed=3, dtype="float32", config_overrides={"head_dim": 64})
    e = Engine.load(str(path), progress=False, batch=8, kv_quant="4",
                    prompt_cache_bytes=1 << 30, memory=MemoryConfig(margin_bytes=0))
    e.worker.lanes[0].idle_release_s = 3600.0
    try:
        first = run_all(e, BODIES)
        settled(e)
        busy = blocks(e)
        e.prefix.max_bytes = 40 * busy["bytes_per_block"]  # the next stores evict: holes
        assert [r.content for r in run_all(e, BODIES)] == [r.content for r in first]
        settled(e)
        e.worker.lanes[0].idle_release_s = IDLE_S
        e.worker.run_sync(lambda: None, timeout=60)  # (the worker reads the new delay)
        idle = released(e)
        consistent(e)
        assert idle["kv_quant"] == "4" and 0 < idle["bytes"] < busy["bytes"], (busy, idle)
        assert idle["capacity"] == idle["used"]
        again = run_all(e, BODIES)
        assert [r.content for r in again] == [r.content for r in first]
        assert sum(r.finish.usage.cached_tokens for r in again) >= 16
    finally:
        close(e)
