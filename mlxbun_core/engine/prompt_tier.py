"""The prefix cache's SSD tier: the half of :class:`~.prompt_cache.PrefixCache` that
meets the disk (``kvstore.SsdStore``).

Entries leaving RAM (evicted, idle past the demotion age, or demoted by a drain) are
written to disk in the background, published entries are written behind when the
engine is idle, and a lookup that misses RAM (or finds far less there) restores the
best disk entry into RAM first, when reading it beats prefilling what it saves. Each
RAM entry (:class:`RamEntry`) carries its disk state. :class:`SsdTier` is the prefix
cache's base: it keeps the tier's counters and calls back into the cache for its
entries (``_entries``, ``_insert``, ``_pop``).
"""

from __future__ import annotations

import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from .. import cache_ops
from .batch.entry import BlockEntry

if TYPE_CHECKING:
    from ..kvstore.store import SsdStore

# A prompt that shares fewer tokens than this with the cache (and not all but its last),
# and holds no whole cached entry, starts cold: mlx-lm's search for the entry extending a
# short common prefix walks that entry's whole tail (30-120 ms for a 5k-token
# conversation, measured on an H200 host and on this CPU) to save a few tokens of prefill.
MIN_HIT = 64
# An SSD entry is restored over a RAM hit only when it covers this share more of the prompt
# (re-reading a whole entry to save a few tokens of prefill loses).
SSD_GAIN = 0.25


class SsdTier(ABC):
    """The SSD half of a prefix cache (``tier`` None: RAM only)."""

    _lock: threading.Lock

    def __init__(self, tier: SsdStore | None,
                 post: Callable[[Callable[[], None]], None] | None) -> None:
        """``post(fn)`` runs ``fn`` on the MLX owner thread (the idle-demotion sweep is
        timed on the tier's writer thread)."""
        self.tier = tier
        # what idleness is measured by (RamEntry.last_used); a test may hand in its own
        self.clock: Callable[[], float] = time.monotonic
        self.ssd_hits = self.ssd_hit_tokens = 0
        self.ssd_skipped = 0  # disk entries left alone: recomputing them was faster
        # prompt tokens a second this device prefills (the engine's pacer); None: unknown
        self.prefill_rate: Callable[[], float | None] = lambda: None
        # the same, once real prompts (not the start-up calibration) measured it: kept
        # beside the SSD entries for the next start
        self.prefill_measured: Callable[[], float | None] = lambda: None
        if self.tier is not None and post is not None and self.tier.config.demote_idle_s > 0:
            age = self.tier.config.demote_idle_s
            self.tier.queue.on_tick(lambda: self._idle_sweep(post), min(30.0, max(0.05, age / 4)))

    # -- what the cache itself keeps -------------------------------------------------------
    @abstractmethod
    def _entries(self) -> list[tuple[Hashable, list[int], RamEntry]]:
        """Every RAM entry, as ``(namespace, tokens, entry)``."""

    def _pinned(self, namespace: Hashable, tokens: list[int]) -> bool:
        """Whether a live pin keeps the entry at ``tokens`` (the cache knows its pins)."""
        return False

    @abstractmethod
    def _insert(self, namespace: Hashable, tokens: list[int], cache: list[Any] | BlockEntry,
                cache_type: str, durable: bool) -> None:
        """Keep ``cache`` in RAM (evicting what no longer fits)."""

    @abstractmethod
    def _pop(self, namespace: Hashable, tokens: list[int], by: str | None = None) -> RamEntry:
        """Take the entry at ``tokens`` out of RAM (the caller holds the lock); ``by``:
        what evicted it (None: it is replaced or moved, not lost)."""

    # -- restores --------------------------------------------------------------------------
    def _ssd(self) -> SsdStore:
        """The SSD tier, in the paths only a cache with one takes."""
        assert self.tier is not None
        return self.tier

    def _restore(self, namespace: Hashable, tokens: list[int],
                 ram_n: int) -> tuple[list[Any], int] | None:
        """``(cache, n)`` from the best SSD entry when it beats the RAM hit clearly; the
        restored entry also joins RAM (already durable)."""
        tier = self._ssd()
        key = tier.key(namespace)
        found = tier.find(key, tokens) if key is not None else None
        if found is None:
            return None
        entry, usable = found
        if usable < min(MIN_HIT, len(tokens) - 1) and usable != entry.n:
            return None
        if usable <= ram_n + max(1, int(SSD_GAIN * usable)):
            return None
        if not self._worth_restoring(entry.nbytes, usable - ram_n):
            with self._lock:
                self.ssd_skipped += 1
            return None
        got = tier.restore(entry)
        if got is None:
            return None
        restored, cache_type = got
        cut = entry.n - usable
        if cut and not trimmable(restored):
            return None  # the header said trimmable; the objects disagree: not usable
        cache = cache_ops.copy(restored)
        if cut:
            cache_ops.trim(cache, cut)
        self._insert(namespace, entry.tokens.tolist(), restored, cache_type, durable=True)
        with self._lock:
            self.ssd_hits += 1
            self.ssd_hit_tokens += usable
        return cache, usable

    def _worth_restoring(self, size: int, tokens: int) -> bool:
        """A restore must beat recomputing what it saves: the file at the restore speed
        seen so far against ``tokens`` at the measured prefill rate. (An H200 prefills
        24k tokens of an 8B model in 2.3 s; their 3.6 GB of KV took 4.7 s to restore from
        a 1.9 GB/s disk. A CPU or a Mac prefills 10-100x slower.) Both rates are seeded
        before the first request (``kvstore/rates.py``, the engine's calibration); either
        still unknown: restore, and so measure it."""
        rate, bps = self.prefill_rate(), self._ssd().restore_bps
        if not rate or not bps:
            return True
        return size / bps < tokens / rate

    def _keep_prefill_rate(self) -> None:
        """Hand the tier the prefill rate real prompts measured (if any yet), which it
        keeps beside its entries to seed the next start's restore decision."""
        if self.tier is not None:
            self.tier.prefill.note(self.prefill_measured())

    # -- writes and demotion ---------------------------------------------------------------
    def _persist(self, namespace: Hashable, tokens: list[int], entry: RamEntry,
                 urgent: bool) -> bool:
        """Queue ``entry`` for the disk unless it is there or on its way; True when it
        is durable or queued."""
        if entry.durable:
            return True
        job = entry.job
        if job is not None:  # queued behind; now it is leaving RAM or being flushed
            if urgent and not job.urgent:
                job.urgent = True
                self._ssd().queue.poke()
            return True
        if entry.volatile:
            return False
        tier = self._ssd()
        key = tier.key(namespace)
        value = entry.cache
        dense = value.dense() if isinstance(value, BlockEntry) else value
        job = tier.prepare(key, tokens, dense, entry.cache_type) \
            if key is not None else None
        if job is None:  # an adapter no longer mounted, or a cache we cannot store
            entry.volatile = True
            return False
        job.urgent = urgent
        ref = weakref.ref(entry)
        job.done.append(lambda ok: _written(ref, ok))
        entry.job = job
        return tier.submit(job)

    def persist_all(self) -> int:
        """Queue every RAM entry not yet on disk (a flush or a drain); how many are
        durable or queued now."""
        if self.tier is None:
            return 0
        return sum(self._persist(ns, tokens, e, urgent=True) for ns, tokens, e in self._entries())

    def dirty(self) -> int:
        """RAM entries that could go to disk but are not there yet."""
        return sum(1 for _, _, e in self._entries() if not e.durable and not e.volatile)

    def drop_durable(self, idle_s: float = 0.0, spare_pinned: bool = False) -> int:
        """Free the RAM of entries already on disk (unused for ``idle_s``; with
        ``spare_pinned``, but live pins: a drain frees them too); the count."""
        now, n = self.clock(), 0
        for ns, tokens, e in self._entries():
            if e.durable and now - e.last_used >= idle_s \
                    and not (spare_pinned and self._pinned(ns, tokens)):
                with self._lock:
                    gone = self._pop(ns, tokens, by="demoted")
                release(gone)
                n += 1
        if n and self.tier is not None:
            self.tier.demotions += n
        return n

    def demote_idle(self) -> None:
        """Entries unused past the demotion age: free the durable ones, queue the rest.
        A pinned entry is written but stays in RAM: idleness is no memory pressure, and
        its client asked to keep it (the byte cap still spills it when RAM is short)."""
        age = self._ssd().config.demote_idle_s
        now = self.clock()
        for ns, tokens, e in self._entries():
            if now - e.last_used >= age:
                self._persist(ns, tokens, e, urgent=True)
        self.drop_durable(age, spare_pinned=True)

    def _idle_sweep(self, post: Callable[[Callable[[], None]], None]) -> None:
        """On the writer thread: ask the owner thread to demote when something idle is
        left to demote (written pinned entries stay)."""
        age, now = self._ssd().config.demote_idle_s, self.clock()
        if any(now - e.last_used >= age and not (e.durable and self._pinned(ns, tokens))
               for ns, tokens, e in self._entries()):
            post(self.demote_idle)


class RamEntry:
    """A RAM entry: the cache, its kind (``prefix_index.KINDS``), and its disk state:
    ``durable`` (on disk), ``job`` (a write queued), ``volatile`` (cannot be written)."""

    __slots__ = ("cache", "cache_type", "durable", "job", "volatile", "last_used",
                 "__weakref__")

    def __init__(self, cache: list[Any] | BlockEntry, cache_type: str, durable: bool,
                 last_used: float):
        self.cache, self.cache_type, self.durable = cache, cache_type, durable
        self.job: Any = None
        self.volatile = False
        self.last_used = last_used  # on the tier's clock


def release(value: Any) -> None:
    """Give back the blocks of an entry leaving the cache (``RamEntry`` or its value)."""
    cache = getattr(value, "cache", value)
    if isinstance(cache, BlockEntry):
        cache.release()


def _written(ref: weakref.ref[Any], ok: bool) -> None:
    """A write finished (on the writer thread): the entry is durable, or dirty again."""
    entry = ref()
    if entry is not None:
        entry.job = None
        entry.durable = entry.durable or ok


def trimmable(cache: list[Any]) -> bool:
    from mlx_lm.models.cache import can_trim_prompt_cache

    return bool(can_trim_prompt_cache(cache))
