"""Pinned prefixes: the prompt prefixes clients asked the cache to keep, and until when.

A pin is a namespace and a token prefix (an Anthropic ``cache_control`` breakpoint, or
the prompt of an OpenAI ``prompt_cache_key``) with an expiry. Each request that names
it again refreshes it. While a pin lives, the prefix cache keeps an entry of exactly its
tokens and evicts it last (only when unpinned entries alone cannot make room); once it
expires the entry is an ordinary one. A keyed pin (``prompt_cache_key``) holds one
prefix per key: a new prompt under the key replaces the old one's pin.

The clock is injectable (``clock``), so a test can expire a 5-minute pin at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

TTLS = {"5m": 300.0, "1h": 3600.0}
"""Anthropic's ``cache_control.ttl`` values, in seconds (``5m`` when not given)."""
KEY_TTL = 600.0
"""How long a ``prompt_cache_key`` pins its prompt: OpenAI keeps a cached prefix 5 to
10 minutes after its last use; we keep the upper end."""


@dataclass(frozen=True)
class Pin:
    """One pin a request asks for: its first ``length`` prompt tokens for ``ttl`` seconds
    (``key``: the ``prompt_cache_key`` it came from, if any)."""

    length: int
    ttl: float
    key: str | None = None


class Pins:
    """The live pins, by ``(namespace, tokens)``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until: dict[tuple[Hashable, tuple[int, ...]], float] = {}
        self._keyed: dict[tuple[Hashable, str], tuple[int, ...]] = {}
        self._lock = threading.Lock()  # pinned on the event loop, read on the MLX thread

    def pin(self, namespace: Hashable, tokens: Sequence[int], ttl: float,
            key: str | None = None) -> None:
        """Pin ``tokens`` for ``ttl`` seconds from now (refreshing a live pin)."""
        now = self.clock()
        at = (namespace, tuple(tokens))
        with self._lock:
            self._prune(now)
            if key is not None:
                old = self._keyed.get((namespace, key))
                if old is not None and old != at[1]:
                    self._until.pop((namespace, old), None)
                self._keyed[(namespace, key)] = at[1]
            self._until[at] = max(self._until.get(at, 0.0), now + ttl)

    def pin_request(self, namespace: Hashable | None, prompt: Sequence[int],
                    wanted: Sequence[Pin]) -> tuple[int, ...]:
        """Pin (or refresh) the prefixes of ``prompt`` a request asked to cache (none when
        it is never cached: ``namespace`` None); its breakpoints' lengths, for usage."""
        if namespace is not None:
            for p in wanted:
                self.pin(namespace, prompt[:p.length], p.ttl, p.key)
        return tuple(sorted({p.length for p in wanted if p.key is None}))

    def pinned(self, namespace: Hashable, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` is a live pin."""
        with self._lock:
            return self._until.get((namespace, tuple(tokens)), 0.0) > self.clock()

    def within(self, namespace: Hashable, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        """The live pins of ``namespace`` that are prefixes of ``tokens``, shortest first."""
        now = self.clock()
        with self._lock:
            return sorted((t for (ns, t), until in self._until.items()
                           if ns == namespace and until > now and len(t) <= len(tokens)
                           and tuple(tokens[:len(t)]) == t), key=len)

    def count(self) -> int:
        now = self.clock()
        with self._lock:
            return sum(1 for until in self._until.values() if until > now)

    def _prune(self, now: float) -> None:
        for at in [at for at, until in self._until.items() if until <= now]:
            del self._until[at]
        self._keyed = {k: t for k, t in self._keyed.items() if (k[0], t) in self._until}
