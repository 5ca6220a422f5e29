"""The SSD tier: find, restore and (in the background) write prefix-cache entries.

One :class:`SsdStore` per engine. The MLX owner thread calls :meth:`prepare` (evaluate
and describe a cache for writing), :meth:`find` and :meth:`restore`; the writer thread
does all file writing. Every failure degrades to "no hit" or "not stored": a full or
failing disk puts the tier in a degraded state (a warning in the log and in
``/stats``; writes retried after ``RETRY_S``), and a file that fails any check is
removed, never served.
"""

from __future__ import annotations

import errno
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import codec
from .config import DEFAULT_FREE_SHARE, DEFAULT_MAX_BYTES, SsdConfig
from .fileformat import CorruptEntry, EntryHeader, drop_pages, read_header, write_entry
from .identity import namespace_key
from .index import Index, IndexEntry
from .rates import PrefillRecord, seed_restore_rate
from .writer import WriteJob, WriteQueue

log = logging.getLogger("mlxbun.kvstore")

RETRY_S = 30.0
# A new rewindable file replaces the older files of its conversation that it serves all
# but this many trailing tokens of (one file per conversation, not one per turn).
SUPERSEDE_SLACK = 64


def default_max_bytes(root: Path, used: int) -> int:
    """min(50 GiB, a quarter of what the filesystem could give us)."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return DEFAULT_MAX_BYTES
    return int(min(DEFAULT_MAX_BYTES, DEFAULT_FREE_SHARE * (free + used)))


class SsdStore:
    def __init__(self, config: SsdConfig, fingerprint: str, *,
                 namespace_parts: Callable[[Any], list | None] = lambda ns: None,
                 busy: Callable[[], bool] = lambda: False, private_copies: bool = False):
        self.config = config
        self.root = Path(config.dir).expanduser().resolve()
        self.fingerprint = fingerprint
        self.namespace_parts = namespace_parts  # RAM namespace -> its durable identity
        self.private_copies = private_copies
        self.degraded: str | None = None
        self._retry_at = 0.0
        self.restores = self.spills = self.demotions = self.restore_failures = 0
        self.restore_ms_last = 0.0
        # bytes a second restores run at (the best seen; seeded by seed_rates)
        self.restore_bps: float | None = None
        self.restore_source = "unknown"
        self.restore_bytes_last = 0
        self.evicted = 0
        self._lock = threading.Lock()
        self.index = Index(self.root, fingerprint)
        self.prefill = PrefillRecord(self.index.home)  # this model's measured prefill rate
        try:
            self.index.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._degrade(f"cannot create {self.index.home}: {exc.strerror or exc}")
        self.index.scan()
        used = sum(size for _, size, _ in self.index.disk_files())
        self.max_bytes = config.max_bytes or default_max_bytes(self.root, used)
        self.queue = WriteQueue(self._write, max_bytes=config.queue_bytes, busy=busy)
        log.info("ssd cache: %s, %d entries (%.2f GB) for this model, cap %.1f GB",
                 self.index.home, len(self.index), self.index.nbytes() / 1e9, self.max_bytes / 1e9)

    # -- keys ------------------------------------------------------------------------
    def key(self, ns) -> str | None:
        """The on-disk namespace of a RAM namespace (None: never written, e.g. an
        adapter no longer mounted)."""
        parts = self.namespace_parts(ns)
        return None if parts is None else namespace_key(self.fingerprint, parts)

    # -- the MLX owner thread --------------------------------------------------------
    def prepare(self, key: str, tokens: list, cache: list, cache_type: str,
                label: str = "") -> WriteJob | None:
        """Evaluate and describe ``cache`` for the writer (None: it cannot be stored)."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        try:
            layout, tensors, dtypes = codec.encode(cache, private=self.private_copies)
        except codec.Unsupported as exc:
            log.debug("ssd cache: not stored: %s", exc)
            return None
        trimmable = bool(can_trim_prompt_cache(cache))
        header = {"format": "mlxbun-kv", "fingerprint": self.fingerprint, "namespace": key,
                  "label": label[:200], "created": time.time(), "cache_type": cache_type,
                  "trimmable": trimmable, "caches": layout}
        return WriteJob(key, np.asarray(tokens, dtype=np.int32), header, tensors, dtypes,
                        sum(int(t.nbytes) for t in tensors), trimmable)

    def find(self, key: str, tokens: list) -> tuple[IndexEntry, int] | None:
        return self.index.find(key, np.asarray(tokens, dtype=np.int32))

    def restore(self, entry: IndexEntry) -> tuple[list, str] | None:
        """``(cache, cache_type)`` rebuilt from ``entry``'s file, every byte checked; None
        (and the file removed when it failed a check) otherwise."""
        t0 = time.perf_counter()
        try:
            with open(entry.path, "rb", buffering=0) as f:
                h = read_header(entry.path, f)
                if (h.header.get("fingerprint") != self.fingerprint
                        or h.header.get("namespace") != entry.ns
                        or not np.array_equal(h.tokens, entry.tokens)):
                    raise CorruptEntry("header does not match the index")
                cache = self.load(entry.path, h)
                drop_pages(f)
        except (CorruptEntry, codec.Unsupported) as exc:
            log.warning("ssd cache: removing %s (%s)", entry.path, exc)
            self.index.corrupt_removed += 1
            self.restore_failures += 1
            self.index.remove(entry.path)
            return None
        except OSError as exc:  # gone (another process evicted it) or unreadable
            log.info("ssd cache: cannot read %s (%s)", entry.path, exc.strerror or exc)
            self.restore_failures += 1
            self.index.remove(entry.path, delete=False)
            return None
        with self._lock:
            self.restores += 1
            seconds = time.perf_counter() - t0
            self.restore_ms_last = 1e3 * seconds
            self.restore_bps = max(self.restore_bps or 0.0, h.size / max(seconds, 1e-6))
            self.restore_bytes_last = h.size
        self.index.touch(entry, time.time())
        return cache, str(h.header.get("cache_type", "assistant"))

    def load(self, path: Path, h: EntryHeader) -> list:
        """The cache objects of a checked file (every byte hashed; CorruptEntry else)."""
        arrays = codec.load_arrays(h, strong=self.config.verify)
        return codec.decode(h.header["caches"], arrays)

    def seed_rates(self) -> None:
        """The restore rate before any restore (``rates.seed_restore_rate``: a setting,
        a kept measurement, or a probe now); on the MLX owner thread, at start-up."""
        bps, self.restore_source = seed_restore_rate(self)
        if bps is not None:
            self.restore_bps = max(self.restore_bps or 0.0, bps)
        log.info("ssd cache: restores at %s (%s); prefill kept from real prompts: %s",
                 f"{self.restore_bps / 1e9:.2f} GB/s" if self.restore_bps else "a rate unknown",
                 self.restore_source, f"{self.prefill.tps:.0f} tok/s" if self.prefill.tps
                 else "none yet")

    # -- any thread ------------------------------------------------------------------
    def submit(self, job: WriteJob) -> bool:
        return self.queue.submit(job)

    def flush(self, timeout: float) -> bool:
        """Write everything queued now; True when the queue emptied in time."""
        self.queue.expedite()
        return self.queue.wait_idle(timeout)

    def close(self) -> None:
        self.queue.close()

    # -- the writer thread -----------------------------------------------------------
    def _write(self, job: WriteJob) -> bool | None:
        if self.degraded is not None and time.monotonic() < self._retry_at:
            return None  # RAM only for now
        if self.index.covering(job.ns, job.tokens) is not None:
            return True  # already durable (a restored entry, or a longer trimmable file)
        directory = self.index.home / job.ns
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path, size = write_entry(directory, job.header, job.tokens,
                                     [codec.host_view(t) for t in job.tensors], job.mx_dtypes,
                                     strong=self.config.verify)
        except OSError as exc:
            self._degrade(f"write failed: {errno.errorcode.get(exc.errno or 0, exc.errno)} "
                          f"{exc.strerror or exc}")
            return False
        if path is None:  # only a cancelled write leaves no file
            return None
        with self._lock:
            self.spills += 1
        self.index.add(IndexEntry(path, job.ns, job.tokens, size, time.time(), job.trimmable))
        if job.trimmable:  # earlier turns are served by trimming this one
            for old in self.index.superseded_by(job.ns, job.tokens, SUPERSEDE_SLACK):
                if old.path != path:
                    self.index.remove(old.path)
        self._enforce_cap(keep=path)
        if self.degraded is not None:
            log.warning("ssd cache: writes work again")
            self.degraded = None
        return True

    def _enforce_cap(self, keep: Path) -> None:
        """Remove the least recently used files (every model's, under the whole
        directory) until the directory fits the cap."""
        files = self.index.disk_files()
        total = sum(size for _, size, _ in files)
        if total <= self.max_bytes:
            return
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            self.index.remove(path)
            self.evicted += 1
            total -= size

    def _degrade(self, reason: str) -> None:
        if self.degraded is None:
            log.warning("ssd cache: %s; serving from RAM only (retrying writes every %.0f s)",
                        reason, RETRY_S)
        self.degraded = reason
        self._retry_at = time.monotonic() + RETRY_S

    # -- reporting -------------------------------------------------------------------
    def stats(self) -> dict:
        q = self.queue
        with self._lock:
            return {"dir": str(self.root), "entries": len(self.index),
                    "bytes": self.index.nbytes(), "max_bytes": self.max_bytes,
                    "restores": self.restores, "spills": self.spills,
                    "restore_ms_last": round(self.restore_ms_last, 1),
                    "restore_gbs": round(self.restore_bps / 1e9, 3) if self.restore_bps
                    else None, "restore_rate_source": self.restore_source,
                    "kept_prefill_tps": self.prefill.tps,
                    "restore_bytes_last": self.restore_bytes_last,
                    "demotions": self.demotions, "pending_spills": q.pending,
                    "pending_spill_bytes": q.pending_bytes, "dropped_spills": q.dropped,
                    "failed_spills": q.failed, "superseded_spills": q.superseded,
                    "evicted": self.evicted, "corrupt_removed": self.index.corrupt_removed,
                    "restore_failures": self.restore_failures,
                    "longest_durable_prefix_tokens": self.index.longest(),
                    "degraded": self.degraded, "verify": self.config.verify,
                    "write_behind": self.config.write_behind,
                    "demote_idle_s": self.config.demote_idle_s}
