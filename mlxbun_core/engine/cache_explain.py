"""Why a prompt hit the prefix cache as far as it did: the ``X-Mlxbun-Cache`` header and
the recent log behind ``/stats`` and ``mlxbun cache explain``.

The lookup (``prompt_cache.py``) leaves what its trie walk found in a :class:`Probe`:
how far the prompt follows the cache's deepest path (the divergence point), the entry
the hit came from, whether it came from disk. A full hit is explained from that alone.
Only a prompt that leaves the cache early costs more, once, before its prefill: the
few tokens on both sides of the divergence are decoded, and two questions are asked
that the lookup never needs: did an evicted entry (:class:`Evictions`) or another
namespace of the same model (a different adapter, KV mode or media) share more?
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..sequences import common_prefix
from .prompt_tier import MIN_HIT

if TYPE_CHECKING:
    from .prefix_index import PrefixIndex
    from .session import GenerationRequest, GenerationSession

HEADER = "X-Mlxbun-Cache"
OFF = "off"  # the request never looks the cache up (cache off, draft model, embeddings)
# engine.cache_namespace's parts, in order; those after the first two tell namespaces of
# one model apart
PARTS = ("model", "checkpoint", "adapter", "kv", "media")
CONTEXT = 8  # tokens decoded on each side of a divergence
TEXT_MAX = 240  # characters kept of each decoded piece


@dataclass
class Probe:
    """What one lookup found, filled in as it goes (nothing computed for it alone)."""

    namespace: Hashable | None = None  # the namespace searched (None: not looked up)
    shared: int = 0  # prompt tokens along the trie's deepest path
    node: dict[Any, Any] | None = None  # the trie node there
    entry: int = 0  # tokens of the entry the hit came from
    exact: bool = False  # an entry equal to the prompt
    ssd: bool = False  # restored from the SSD tier


@dataclass
class Ghost:
    """An entry that left RAM: its tokens, what took it and when."""

    namespace: Hashable
    tokens: np.ndarray  # int32
    by: str  # "lru", "pressure", "demoted", "cleared", "reset", "too_big" (never kept)
    when: float  # time.time()


class Evictions:
    """The tokens of recently evicted entries, newest last, capped in count and bytes;
    consulted only for a prompt the cache served short."""

    def __init__(self, max_entries: int = 128, max_bytes: int = 8 << 20):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._ghosts: deque[Ghost] = deque()
        self.nbytes = 0
        self.counts: dict[str, int] = {}

    def add(self, namespace: Hashable, tokens: Sequence[int], by: str) -> None:
        self.counts[by] = self.counts.get(by, 0) + 1
        arr = np.asarray(tokens, dtype=np.int32)
        if arr.nbytes > self.max_bytes:
            arr = arr[:self.max_bytes // 4]  # (its prefix still explains a miss)
        self._ghosts.append(Ghost(namespace, arr, by, time.time()))
        self.nbytes += arr.nbytes
        while len(self._ghosts) > self.max_entries or self.nbytes > self.max_bytes:
            self.nbytes -= self._ghosts.popleft().tokens.nbytes

    def best(self, namespace: Hashable, prompt: Callable[[], np.ndarray]
             ) -> tuple[Ghost, int] | None:
        """The evicted entry of ``namespace`` sharing the most leading tokens with the
        prompt (made by ``prompt()`` only if one is there), newest on a tie."""
        found: tuple[Ghost, int] | None = None
        for ghost in reversed(self._ghosts):
            if ghost.namespace != namespace:
                continue
            shared = common_prefix(ghost.tokens, prompt())
            if found is None or shared > found[1]:
                found = (ghost, shared)
        return found


@dataclass
class Explanation:
    """One request's cache outcome: ``hit`` of ``prompt`` tokens, and why (``reason``:
    exact, within, extends, diverged, evicted, namespace, ssd, empty, short)."""

    prompt: int
    hit: int
    reason: str
    at: int | None = None  # tokens shared with the best entry (where the prompt left it)
    entry: int | None = None  # that entry's length
    namespace: list[str] = field(default_factory=list)  # parts that differ (reason namespace)
    by: str | None = None  # what evicted it (reason evicted)
    evicted_at: float | None = None
    note: str | None = None  # why the hit stops short of ``at``
    text: dict[str, str] | None = None  # decoded around ``at``: before, prompt, cached
    time: float = field(default_factory=time.time)

    def header(self) -> str:
        parts = [f"hit={self.hit}/{self.prompt}", f"reason={self.reason}"]
        if self.at is not None:
            parts.append(f"at={self.at}")
        if self.namespace:
            parts.append("ns=" + ",".join(self.namespace))
        if self.by is not None:
            parts.append(f"by={self.by}")
            if self.evicted_at is not None:
                parts.append(f"age={max(0, round(self.time - self.evicted_at))}s")
        if self.note is not None:
            parts.append(f"note={self.note}")
        return "; ".join(parts)

    def record(self, lane: str) -> dict[str, Any]:
        out: dict[str, Any] = {"time": round(self.time, 3), "lane": lane,
                               "prompt_tokens": self.prompt, "hit_tokens": self.hit,
                               "reason": self.reason, "header": self.header()}
        for key in ("at", "entry", "by", "evicted_at", "note", "text"):
            value = getattr(self, key)
            if value is not None:
                out[key if key != "entry" else "entry_tokens"] = value
        if self.namespace:
            out["namespace"] = self.namespace
        return out


class RecentLog:
    """The last requests' explanations, capped in count and in JSON bytes (thread-safe:
    the worker adds, ``/stats`` reads)."""

    def __init__(self, max_entries: int = 128, max_bytes: int = 128 << 10):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._rows: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, row: dict[str, Any]) -> None:
        size = len(json.dumps(row))
        with self._lock:
            self._rows.append((row, size))
            self._bytes += size
            while len(self._rows) > self.max_entries or self._bytes > self.max_bytes:
                self._bytes -= self._rows.popleft()[1]

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r, _ in self._rows]


def without_text(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` without the decoded prompt text (for a client that may not read prompts)."""
    return [{k: v for k, v in r.items() if k != "text"} for r in rows]


class Explains(Protocol):
    """What :func:`explain_job` needs of the prefix cache (``prompt_cache.PrefixCache``,
    which imports this module)."""

    def explain(self, probe: Probe, tokens: list[int], hit: int,
                decode: Callable[[list[int]], str], lane: str) -> str: ...


class Admitted(Protocol):
    """What :func:`explain_job` needs of the job (``job.GenerationJob``, which imports
    this module)."""

    request: GenerationRequest
    session: GenerationSession


def explain_job(cache: Explains, job: Admitted, probe: Probe, hit: int) -> str:
    """The header value for ``job``'s lookup (timed as the ``cache_explain_s`` phase)."""
    t0, session = time.perf_counter(), job.session
    note = cache.explain(probe, job.request.prompt_tokens, hit, session.tokenizer.decode,
                         session.usage.lane)
    session.phases["cache_explain_s"] = time.perf_counter() - t0
    return note


class Explainer:
    """Turns a :class:`Probe` into an :class:`Explanation` against the index it searched."""

    def __init__(self) -> None:
        self.evictions = Evictions()
        self.recent = RecentLog()

    def explain(self, index: PrefixIndex, probe: Probe, tokens: list[int], hit: int,
                decode: Callable[[list[int]], str]) -> Explanation:
        n, ns = len(tokens), probe.namespace
        if ns is None:
            return Explanation(n, hit, "short")
        if probe.ssd:
            return Explanation(n, hit, "ssd", entry=probe.entry or None)
        got = self._own(index, probe, tokens, hit)
        if hit >= n - 1:
            return got
        arr: list[np.ndarray] = []

        def prompt() -> np.ndarray:
            if not arr:
                arr.append(np.asarray(tokens, dtype=np.int32))
            return arr[0]

        best = max(probe.shared, hit, min(MIN_HIT, n - 1) - 1)  # (less would not hit)
        ghost = self.evictions.best(ns, prompt)
        if ghost is not None and ghost[1] > best:
            g, at = ghost
            got = Explanation(n, hit, "evicted", at=at, entry=len(g.tokens), by=g.by,
                              evicted_at=g.when)
            best = at
            cached = g.tokens[at:at + CONTEXT].tolist()
        else:
            cached = index.continuation(probe.node, CONTEXT)
        other = _other_namespace(index, ns, tokens, best)
        if other is not None:
            node, at, parts = other
            got = Explanation(n, hit, "namespace", at=at, namespace=parts)
            cached = index.continuation(node, CONTEXT)
        if got.at is not None and got.at < n and cached:
            got.text = _around(tokens, got.at, cached, decode)
        return got

    def _own(self, index: PrefixIndex, probe: Probe, tokens: list[int], hit: int
             ) -> Explanation:
        """The outcome within the request's own namespace, from the probe alone."""
        n, k = len(tokens), probe.shared
        if probe.exact:
            reason = "exact"
        elif k >= n:
            reason = "within"
        elif probe.node is None:  # the namespace holds nothing
            return Explanation(n, hit, "empty")
        elif index.branches(probe.node):
            reason = "diverged"
        else:
            reason = "extends"
        got = Explanation(n, hit, reason, at=k if reason == "diverged" else None,
                          entry=probe.entry or None)
        if hit < min(k, n - 1):
            got.note = "below-min" if k < MIN_HIT else "no-rewind"
        return got


def _other_namespace(index: PrefixIndex, namespace: Hashable, tokens: list[int], best: int
                     ) -> tuple[dict[Any, Any] | None, int, list[str]] | None:
    """Another namespace of the same model whose entries share more than ``best`` tokens
    of the prompt: ``(its trie node there, shared, the parts that differ)``."""
    found = None
    for other in index.namespaces():
        parts = _differing(namespace, other)
        if not parts:
            continue
        shared, _, node = index.walk(other, tokens)
        if shared > best:
            found, best = (node, shared, parts), shared
    return found


def _differing(a: Hashable, b: Hashable) -> list[str]:
    """The namespace parts in which ``a`` and ``b`` differ, when both are namespaces of
    the same model and the same entry kind ([] otherwise)."""
    if a == b or not isinstance(a, tuple) or not isinstance(b, tuple) or len(a) != len(b):
        return []
    if len(a) == 2 and isinstance(a[0], tuple):  # (namespace, entry kind): kinds kept apart
        return _differing(a[0], b[0]) if a[1] == b[1] else []
    if len(a) != len(PARTS) or a[:2] != b[:2]:
        return []
    return [name for name, x, y in zip(PARTS[2:], a[2:], b[2:]) if x != y]


def _around(tokens: list[int], at: int, cached: list[int],
            decode: Callable[[list[int]], str]) -> dict[str, str]:
    """The text on both sides of the divergence: what both share just before it, what
    the prompt has there, what the cache had."""
    def text(ids: list[int]) -> str:
        return decode(ids)[:TEXT_MAX] if ids else ""

    return {"before": text(tokens[max(0, at - CONTEXT):at]),
            "prompt": text(tokens[at:at + CONTEXT]), "cached": text(cached)}
