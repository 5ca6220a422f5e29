"""A short-lived cache of the library scan, shared by every route that lists models."""

from __future__ import annotations

import asyncio
import threading
import time

from .scan import Entry, scan

TTL_S = 30.0


class LibraryCache:
    """The last scan, reused for ``ttl_s``; ``refresh=True`` rescans now."""

    def __init__(self, ttl_s: float = TTL_S, scanner=scan):
        self.ttl_s, self._scanner = ttl_s, scanner
        self._entries: list[Entry] | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def entries(self, refresh: bool = False) -> list[Entry]:
        with self._lock:
            if refresh or self._entries is None or time.monotonic() - self._at > self.ttl_s:
                self._entries = self._scanner()
                self._at = time.monotonic()
            return self._entries

    async def aentries(self, refresh: bool = False) -> list[Entry]:
        """Off the event loop: a scan stats files and reads headers."""
        return await asyncio.to_thread(self.entries, refresh)

    def find(self, model_id: str) -> Entry | None:
        """The supported entry with exactly this id (the cached scan; no rescan)."""
        return next((e for e in self.entries() if e.id == model_id and e.claim), None)


def model_row(entry: Entry, created: int) -> dict:
    """A local model as a ``/v1/models`` row (the served model has its own, richer row)."""
    claim = entry.claim
    if claim is None:  # callers list supported entries only
        raise ValueError(f"{entry.id} is not a supported model")
    return {"id": entry.id, "object": "model", "created": created, "owned_by": "mlxbun",
            "tier": entry.tier, "vision": entry.vision, "audio": entry.audio,
            "context_window": entry.context_length, "family": claim.family,
            "plugin": claim.plugin}


def local_rows(entries: list[Entry], served_id: str, created: int) -> list[dict]:
    """Supported local models other than the served one, for ``/v1/models``."""
    return [model_row(e, created) for e in entries if e.claim and e.id != served_id]
