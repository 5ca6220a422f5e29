"""An idle batch lane gives its memory back (a mixin of :class:`~.batch.BatchLane`).

The block pool grows to what the busiest moment needed and MLX keeps the buffers it
freed in its cache, so a server that served a load and went quiet would go on holding
nearly all of the device: another process, or a second server on the same card,
could not get memory while this one sits idle. Once the lane has had no row and no
queue for :data:`IDLE_RELEASE_S` (the worker waits that long for its next message,
``worker.py``):

- the pool's storage shrinks to the blocks still held, the prefix cache's entries:
  they are renumbered to the lowest ids (``BlockPool.compact``, each entry's table
  follows) and every layer's storage is copied down to them, one layer at a time, so
  hits go on sharing the same KV; with nothing held the storage keeps one block;
- MLX's buffer cache goes back to the device (``mx.clear_cache``), and a fresh
  reading of free memory shows what was given back.

While rows run, memory that falls short (the governor reads less free than the pool's
free blocks above its highest held one take) gives those blocks back
(``BlockPool.cut_top``, nothing renumbered; the running rows keep room for what they
still take), when they are a quarter of the pool or more, at most once a second.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..memory import MEASURE_EVERY_S, Governor

if TYPE_CHECKING:
    from ..batch import Batch
    from ..prompt_cache import PrefixCache
    from ..speculate.mtp_batch import MtpBatch

log = logging.getLogger("mlxbun.engine")

# seconds without a row or a queue before the lane gives memory back: past a burst's
# gaps (a client's next request after its last answer), short enough that a process
# waiting for the memory gets it soon; regrowing costs a few copies of the pool
IDLE_RELEASE_S = 2.0
LOG_BYTES = 64 << 20  # an idle release that frees less says nothing in the log
TRIM_SHARE = 4  # a busy pool trims when a quarter of it or more is free at the top


class IdleRelease:
    """Memory given back when idle or short (:class:`~.batch.BatchLane` holds what is
    declared here)."""

    governor: Governor
    prefix: PrefixCache | None
    mtp: MtpBatch | None
    _batch: Batch | None
    idle_release_s = IDLE_RELEASE_S  # (tests shorten it)

    @property
    def active(self) -> int:
        raise NotImplementedError

    @property
    def waiting(self) -> int:
        raise NotImplementedError

    def _outstanding(self) -> int:
        raise NotImplementedError

    def _init_idle(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._idle_clock = clock
        self._busy_at = clock()
        self._rested = True  # nothing to give back until the lane has worked
        self._trimmed_at = -MEASURE_EVERY_S
        self.released = {"idle_releases": 0, "released_bytes": 0, "pressure_trims": 0}

    def _worked(self) -> None:
        """A step ran (or found work): the idle clock starts again."""
        self._busy_at = self._idle_clock()
        self._rested = False

    def idle_in(self) -> float | None:
        """Seconds until the lane gives memory back (0: now); None when it has nothing
        to give (it did already) or is busy."""
        if self._rested or self.active or self.waiting:
            return None
        return max(0.0, self._busy_at + self.idle_release_s - self._idle_clock())

    def rest(self) -> int:
        """Give memory back now (the lane is idle): the pool's storage shrinks to the
        blocks the prefix cache holds, MLX's cache is emptied. The bytes freed."""
        import mlx.core as mx

        if self.active or self.waiting:
            return 0
        self._rested = True
        batch = self._batch
        before = batch.layout.nbytes if batch is not None else 0
        blocks = batch.pool.capacity - 1 if batch is not None else 0
        cached = int(mx.get_cache_memory())
        if batch is not None and batch.layout.journal is None:
            self._shrink(batch)
        if self.mtp is not None and not self.mtp.rows:
            self.mtp.reset()  # the heads' pool goes (made again with the next MTP row)
        mx.clear_cache()
        self.governor.available(fresh=True)
        pool = before - (batch.layout.nbytes if batch is not None else 0)
        freed = pool + cached
        self.released["idle_releases"] += 1
        self.released["released_bytes"] += pool
        if freed >= LOG_BYTES:
            log.info("idle: gave back %.0f MiB (KV pool %d -> %d blocks, %.0f MiB; MLX cache "
                     "%.0f MiB)", freed / 2**20, blocks,
                     batch.pool.capacity - 1 if batch is not None else 0, pool / 2**20,
                     cached / 2**20)
        return freed

    def _shrink(self, batch: Batch) -> None:
        """Compact the pool to the prefix cache's blocks; when something else holds
        blocks too (a table this lane cannot renumber), only trim its free top."""
        pool = batch.pool
        tables = self.prefix.block_tables(batch.layout) if self.prefix is not None else []
        held = collections.Counter(b for t in tables for b in t.blocks)
        order: list[int] | None
        if all(pool.refs(b) == held[b] for b in range(1, pool.capacity)):
            order = pool.compact()
            moved = {old: new for new, old in enumerate(order)}
            for t in tables:
                t.renumber(moved)
        else:
            order = pool.cut_top()
        if order is not None:
            batch.layout.keep(order)

    def _trim_if_short(self, batch: Batch) -> None:
        """Memory is short while rows run (less free than the pool's free blocks at its
        top would take): give those back, keeping what the rows still take, when they
        are a good share of the pool (not every step: at most once per reading)."""
        pool = batch.pool
        now = self._idle_clock()
        if batch.layout.journal is not None or now - self._trimmed_at < MEASURE_EVERY_S:
            return
        per_block = batch.layout.bytes_per_block()
        top = pool.free_at_top(pool.used + self._outstanding())
        if not per_block or top * TRIM_SHARE < pool.capacity \
                or self.governor.room(top * per_block) >= top * per_block:
            return
        self._trimmed_at = now
        before = batch.layout.nbytes
        order = pool.cut_top(pool.used + self._outstanding())
        if order is None:
            return
        batch.layout.keep(order)
        freed = before - batch.layout.nbytes
        self.released["pressure_trims"] += 1
        self.released["released_bytes"] += freed
        log.info("memory short: gave back the KV pool's %d free blocks at its top (%.0f MiB)",
                 top, freed / 2**20)
