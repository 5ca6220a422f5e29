"""The per-process store behind /v1/responses ``previous_response_id``.

Keeps each response's conversation (chat-shaped messages + the system text) as
UTF-8 JSON, so the byte cap measures exactly what is held. Entries expire after
``ttl_s``; past ``max_bytes`` the least recently used go first.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

TTL_S = 3600.0
MAX_BYTES = 32 * 1024 * 1024


class ResponseStore:
    def __init__(self, max_bytes: int = MAX_BYTES, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.max_bytes, self.ttl_s, self.clock = max_bytes, ttl_s, clock
        # id -> (stored_at, json)
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, key: str, value: dict[str, Any]) -> bool:
        """Store ``value``; False when it alone exceeds the cap (not stored)."""
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        if len(text) > self.max_bytes:
            return False
        with self._lock:
            self._drop(key)
            self._items[key] = (self.clock(), text)
            self._bytes += len(text)
            self._expire()
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))
        return True

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored value (and mark it recently used), or None if unknown/expired."""
        with self._lock:
            self._expire()
            entry = self._items.get(key)
            if entry is None:
                return None
            self._items.move_to_end(key)
            value: dict[str, Any] = json.loads(entry[1])
            return value

    def delete(self, key: str) -> None:
        with self._lock:
            self._drop(key)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._expire()
            return {"entries": len(self._items), "bytes": self._bytes,
                    "max_bytes": self.max_bytes, "ttl_ms": int(self.ttl_s * 1000)}

    def _drop(self, key: str) -> None:
        entry = self._items.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry[1])

    def _expire(self) -> None:
        # Insertion order is not expiry order once get() reorders, so scan all;
        # the store holds at most a few thousand entries.
        limit = self.clock() - self.ttl_s
        for key in [k for k, (t, _) in self._items.items() if t < limit]:
            self._drop(key)
