"""The durability boundary: flush (``POST /admin/cache/flush``), drain demotion
(``/admin/drain`` of an ``--isolate`` engine) and the flush at shutdown.

A flush first asks the MLX owner thread to queue every RAM entry not yet on disk
(preparing a write needs MLX), then waits for the writer. It is *durable* only when
the queue emptied, nothing failed or was dropped meanwhile, and no RAM entry is
left dirty; a retry never turns a failure into success without the data on disk.
"""

from __future__ import annotations

import asyncio
import threading
import time

DEFAULT_TIMEOUT_S = 120.0


def _report(engine, ok: bool, before: tuple, started: float) -> dict:
    tier = engine.prefix.tier
    q = tier.queue
    failed, dropped = q.failed - before[0], q.dropped - before[1]
    missing = engine.prefix.dirty()
    stats = tier.stats()
    return {"enabled": True,
            "durable": bool(ok and not failed and not dropped and not missing),
            "flushedSnapshots": q.written - before[2], "missingSnapshots": missing,
            "pendingSnapshots": q.pending, "pendingSpills": q.pending,
            "pendingSpillBytes": q.pending_bytes, "droppedSpills": dropped,
            "failedSpills": failed, "elapsedMs": round(1e3 * (time.perf_counter() - started)),
            "entries": stats["entries"], "bytes": stats["bytes"],
            "longest_durable_prefix_tokens": stats["longest_durable_prefix_tokens"],
            "degraded": stats["degraded"]}


def _disabled() -> dict:
    return {"enabled": False, "durable": False, "flushedSnapshots": 0, "missingSnapshots": 0,
            "pendingSnapshots": 0, "pendingSpills": 0, "pendingSpillBytes": 0,
            "droppedSpills": 0, "failedSpills": 0, "elapsedMs": 0, "entries": 0, "bytes": 0,
            "longest_durable_prefix_tokens": 0}


def _counters(engine) -> tuple:
    q = engine.prefix.tier.queue
    return q.failed, q.dropped, q.written


async def flush(engine, timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """Write every RAM entry not on disk and wait for the writer (event-loop side)."""
    if engine.prefix.tier is None:
        return _disabled()
    started, before = time.perf_counter(), _counters(engine)
    await engine.worker.call(engine.prefix.persist_all)
    ok = await asyncio.to_thread(engine.prefix.tier.flush, timeout)
    checkpoints = getattr(engine, "checkpoints", None)
    if checkpoints is not None:  # queued generation snapshots too
        ok = await asyncio.to_thread(checkpoints.flush, timeout) and ok
    return _report(engine, ok, before, started)


async def demote(engine, timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """Flush, then free the RAM of every entry now on disk: how many were demoted."""
    if engine.prefix.tier is None:
        return 0
    await flush(engine, timeout)
    return await engine.worker.call(engine.prefix.drop_durable)


def flush_blocking(engine, timeout: float = DEFAULT_TIMEOUT_S) -> dict | None:
    """:func:`flush` from a plain thread (shutdown), bounded by ``timeout`` overall;
    None without a tier."""
    if engine.prefix.tier is None:
        return None
    started, before = time.perf_counter(), _counters(engine)
    queued = threading.Event()

    def persist():
        try:
            engine.prefix.persist_all()
        finally:
            queued.set()

    engine.worker.post(persist)
    queued.wait(timeout)
    left = max(0.0, timeout - (time.perf_counter() - started))
    ok = engine.prefix.tier.flush(left)
    checkpoints = getattr(engine, "checkpoints", None)
    if checkpoints is not None:  # queued generation snapshots too
        ok = checkpoints.flush(max(0.0, timeout - (time.perf_counter() - started))) and ok
    return _report(engine, ok, before, started)
