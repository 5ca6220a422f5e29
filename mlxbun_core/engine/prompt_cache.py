"""The prefix KV cache: reuse the KV of the longest cached prefix of a prompt.

A byte-capped cache over a token trie per namespace (``prefix_index.py``). The
namespace keeps apart what must never share KV: different models, adapters, KV
settings and media. Works for every cache kind mlx-lm uses:

- trimmable caches (full attention; sliding windows that have not wrapped) are
  stored after generation and trimmed back to the common prefix on a hit;
- caches that cannot rewind (recurrent / linear-attention state, wrapped
  windows) are also snapshotted at the prompt boundary, so the next turn, which
  extends this prompt, finds an exact prefix.

Lookups always leave at least the prompt's last token to feed the model, so a
hit still yields the logits of the first new token.

With an SSD tier (``kvstore.SsdStore``), entries leaving RAM go to disk and a lookup
that misses RAM may restore one from there (``prompt_tier.py``, this cache's base).
Everything here runs on the MLX owner thread, except :meth:`stats`.

With ``kinds_apart`` (a distributed serve: moving KV between the block pool and mlx-lm
caches would carry rank 0's shard alone) the batch's block entries and the serial
lane's mlx-lm caches live in separate namespaces: each lane finds only its own kind.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import cache_ops
from .batch.entry import BlockEntry, Shared
from .cache_explain import Explainer, Probe
from .cache_pins import Pins
from .prefix_index import Entry, PrefixIndex
from .prompt_tier import MIN_HIT, SSD_GAIN, RamEntry, SsdTier, release
from .prompt_tier import trimmable as trimmable  # (the lanes import it from here)

if TYPE_CHECKING:
    from ..kvstore.store import SsdStore
    from .batch.layout import Layout
    from .batch.pool import BlockTable

log = logging.getLogger("mlxbun.cache")

@dataclass
class _Plan:
    key: list[int]  # the tokens of the RAM entry to copy
    trim: int  # positions to cut from its end
    n: int  # prompt tokens it then holds


class PrefixCache(SsdTier):
    def __init__(self, max_bytes: int, tier: SsdStore | None = None,
                 post: Callable[[Callable[[], None]], None] | None = None):
        """``tier``: an SSD store (or None); ``post(fn)`` runs ``fn`` on the MLX owner
        thread (the idle-demotion sweep is timed on the tier's writer thread)."""
        self.max_bytes = max_bytes
        self._index = PrefixIndex()
        self._lock = threading.Lock()  # /stats reads from the event loop
        super().__init__(tier if max_bytes > 0 else None, post)
        self.lookups = self.hits = self.hit_tokens = self.stores = 0
        self.kinds_apart = False  # block entries only for the batch, caches for the rest
        self.explainer = Explainer()  # why hits stop short: the header and the recent log
        self.pins = Pins()  # prefixes clients pinned (cache_control, prompt_cache_key)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    # -- lookups ---------------------------------------------------------------------
    def lookup_dense(self, namespace: Hashable, tokens: list[int], probe: Probe | None = None
                     ) -> tuple[list[Any] | None, int]:
        """:meth:`lookup` for a caller whose KV is mlx-lm caches (never a block share)."""
        cache, n = self.lookup(namespace, tokens, probe=probe)
        assert not isinstance(cache, Shared)  # (no layout asked for: always mlx-lm caches)
        return cache, n

    def lookup(self, namespace: Hashable, tokens: list[int], layout: Layout | None = None,
               probe: Probe | None = None) -> tuple[list[Any] | Shared | None, int]:
        """``(cache, n)``: a private cache holding ``tokens[:n]``, or ``(None, 0)``. A
        caller whose KV lives in ``layout``'s block pool gets an entry of that pool as
        a :class:`Shared` table over its blocks (nothing copied). ``probe`` keeps what
        the search found, for :meth:`explain`."""
        if not self.enabled or len(tokens) < 2:
            return None, 0
        namespace = self._space(namespace, blocks=layout is not None)
        probe = probe if probe is not None else Probe()
        with self._lock:
            self.lookups += 1
            shared, whole_entry, probe.node = self._index.walk(namespace, tokens)
            probe.namespace, probe.shared = namespace, shared
            plan = None
            if shared >= min(MIN_HIT, len(tokens) - 1) or whole_entry:
                plan = self._plan(namespace, tokens, probe=probe)
        ram_n = plan.n if plan is not None else 0
        if self.tier is not None and ram_n < (1 - SSD_GAIN) * (len(tokens) - 1):
            restored = self._restore(namespace, tokens, ram_n)
            if restored is not None:
                probe.ssd = True
                return restored
        if plan is None or plan.n <= 0:
            return None, 0
        probe.entry = len(plan.key)
        with self._lock:
            cache = self._take(namespace, plan, layout)
            self.hits += 1
            self.hit_tokens += plan.n
        return cache, plan.n

    def _plan(self, namespace: Hashable, tokens: list[int], need_tail: bool = True,
              probe: Probe | None = None) -> _Plan | None:
        """Which RAM entry serves ``tokens`` and how (without copying anything yet): the
        exact entry, else the entry extending the longest shared path when it shares more
        than any shorter entry (and can be trimmed back), else the longest shorter one."""
        index = self._index
        found = index.search(namespace, tokens)
        if probe is not None:
            probe.exact = found.exact is not None
        if found.exact is not None:
            if not need_tail:
                return _Plan(list(tokens), 0, len(tokens))
            if _trimmable(self._cache_at(namespace, tokens)):
                return _Plan(list(tokens), 1, len(tokens) - 1)
            return self._plan(namespace, tokens[:-1], need_tail=False)
        short = len(found.shorter) if found.shorter is not None else 0
        if (found.longer is not None and found.common_prefix > short
                and _trimmable(self._cache_at(namespace, found.longer))):
            n = min(len(tokens) - 1, found.common_prefix)
            return _Plan(found.longer, len(found.longer) - n, n)
        if found.shorter is not None and short > 0:
            return _Plan(found.shorter, 0, short)
        return None

    def _take(self, namespace: Hashable, plan: _Plan,
              layout: Layout | None = None) -> list[Any] | Shared:
        """A private copy of the planned entry, trimmed (a block entry of ``layout``'s
        pool: its blocks, shared); the entry counts as used (for idle demotion; eviction
        order stays by insertion)."""
        entry = self._entry(namespace, plan.key)
        entry.last_used = self.clock()
        value = entry.cache
        if isinstance(value, BlockEntry):
            if value.layout is layout:
                return Shared(*value.share(plan.n))
            return value.dense(plan.n)
        cache: list[Any] = cache_ops.copy(value)
        if plan.trim:
            cache_ops.trim(cache, plan.trim)
        return cache

    def explain(self, probe: Probe, tokens: list[int], hit: int,
                decode: Callable[[list[int]], str], lane: str) -> str:
        """Why ``tokens`` hit ``hit`` tokens (``probe``: what the lookup found): the
        ``X-Mlxbun-Cache`` header's value; the request's row joins the recent log."""
        with self._lock:
            got = self.explainer.explain(self._index, probe, tokens, hit, decode)
        self.explainer.recent.add(got.record(lane))
        return got.header()

    def _space(self, namespace: Hashable, blocks: bool) -> Hashable:
        """Where entries of one kind live (``kinds_apart``: apart from the other kind)."""
        return (namespace, "blocks" if blocks else "caches") if self.kinds_apart else namespace

    def _unspace(self, namespace: Hashable) -> Hashable:
        """The request's namespace of a (possibly kind-apart) stored one."""
        if self.kinds_apart and isinstance(namespace, tuple):
            inner: Hashable = namespace[0]
            return inner
        return namespace

    def _pinned(self, namespace: Hashable, tokens: list[int]) -> bool:
        return self.pins.pinned(self._unspace(namespace), tokens)

    # -- stores ----------------------------------------------------------------------
    def store(self, namespace: Hashable, tokens: list[int], cache: list[Any] | BlockEntry, *,
              boundary: bool = False) -> None:
        """Keep ``cache`` (which holds exactly ``tokens``; a :class:`BlockEntry` is kept
        as it is, its blocks then held by the cache); evicts least recently used."""
        if not self.enabled or not tokens or not cache:
            if isinstance(cache, BlockEntry):
                cache.release()
            return
        namespace = self._space(namespace, blocks=isinstance(cache, BlockEntry))
        if not isinstance(cache, BlockEntry):
            import mlx.core as mx

            # a lazy slice of a bigger array would pin it (and its byte count would not
            # say so): evaluated here, the cache owns its bytes; a lone stream's buffer
            # grows 256 positions at a time, cut to what it holds (539 kept 768)
            cache_ops.compact(cache)
            mx.eval([c.state for c in cache])
        carved = self._carve_pins(namespace, list(tokens), cache)
        self._insert(namespace, list(tokens), cache, "user" if boundary else "assistant",
                     durable=False)
        for pin_tokens, pin_cache in carved:
            self._insert(namespace, pin_tokens, pin_cache, "user", durable=False)

    def _carve_pins(self, namespace: Hashable, tokens: list[int],
                    cache: list[Any] | BlockEntry) -> list[tuple[list[int], Any]]:
        """Entries of exactly each live pin within ``tokens`` that RAM does not hold yet,
        cut from ``cache`` (a prefix of a cache that cannot rewind cannot be cut: such a
        pin is kept only from a snapshot of exactly its tokens)."""
        out: list[tuple[list[int], Any]] = []
        for pin in self.pins.within(self._unspace(namespace), tokens):
            n = len(pin)
            if n < 2 or n == len(tokens) or self.holds(namespace, list(pin)):
                continue
            if not _trimmable(cache):
                continue
            if isinstance(cache, BlockEntry):
                out.append((list(pin), BlockEntry(cache.layout, *cache.share(n))))
                continue
            out.append((list(pin), _prefix_copy(cache, len(tokens) - n)))
        return out

    def _insert(self, namespace: Hashable, tokens: list[int], cache: list[Any] | BlockEntry,
                cache_type: str, durable: bool) -> None:
        entry = RamEntry(cache, cache_type, durable, self.clock())
        if _nbytes(cache) > self.max_bytes:  # it would evict every other entry, then itself
            with self._lock:
                self.explainer.evictions.add(namespace, tokens, "too_big")
            if self.tier is not None:
                self._persist(namespace, tokens, entry, urgent=True)
            release(entry)
            return
        with self._lock:
            removed = self._index.add(namespace, tokens,
                                      Entry(entry, _nbytes(cache), cache_type),
                                      drop_prefixes=_trimmable(cache), keep=self._pinned)
            if not durable:
                self.stores += 1
            evicted = self._evict(self.max_bytes)
        for old in removed:
            release(old.value)
        self._keep_prefill_rate()
        for ns, toks, gone in evicted:
            if self.tier is not None:
                self._persist(ns, toks, gone, urgent=True)
            release(gone)
        if self.tier is not None and not durable and self.tier.config.write_behind:
            self._persist(namespace, tokens, entry, urgent=False)

    def drop_layout(self, layout: Layout) -> int:
        """Forget every block entry of ``layout``'s pool (the pool is being dropped after
        a failed pass); how many."""
        with self._lock:
            gone = [(ns, t) for ns, t in self._index.stored()
                    if self._of_layout(ns, t, layout)]
            for ns, t in gone:
                self._pop(ns, t, by="reset")
        return len(gone)

    def _of_layout(self, namespace: Hashable, tokens: list[int], layout: Layout) -> bool:
        """Whether the entry at ``tokens`` is blocks of ``layout``'s pool."""
        value = self._entry(namespace, tokens).cache
        return isinstance(value, BlockEntry) and value.layout is layout

    def block_tables(self, layout: Layout) -> list[BlockTable]:
        """The tables of every block entry of ``layout``'s pool (renumbered when the
        idle pool compacts: ``lanes/idle.py``)."""
        with self._lock:
            values = [self._entry(ns, t).cache for ns, t in self._index.stored()]
        return [v.table for v in values if isinstance(v, BlockEntry) and v.layout is layout]

    def reclaim(self, layout: Layout, blocks: int) -> int:
        """Evict block entries of ``layout``'s pool, oldest first, until ``blocks`` are
        free in it (the pool ran short); the entries evicted."""
        n = 0
        while layout.pool.free < blocks:
            with self._lock:
                mine = [(ns, t) for ns, t in self._index.stored()
                        if self._of_layout(ns, t, layout)]
                victim = next((v for v in mine if not self._pinned(*v)),
                              mine[0] if mine else None)
                if victim is None:
                    return n
                gone = self._pop(*victim, by="pressure")
            if self.tier is not None:
                self._persist(victim[0], victim[1], gone, urgent=True)
            release(gone)
            n += 1
        return n

    def _evict(self, limit: int) -> list[tuple[Hashable, list[int], Any]]:
        """Pop the oldest entries until the bytes fit ``limit``: unpinned ones first,
        pinned ones only when nothing else is left to evict; of those, first the ones a
        longer entry serves as well (a rolling breakpoint pins each turn's prefix of the
        same conversation). A pinned entry that must go leaves the longest pin within it
        that fits, cut from it (the system prompt under a conversation grown too big)."""
        index = self._index
        out: list[tuple[Hashable, list[int], Any]] = []
        while index.nbytes > limit:
            key = index.oldest(skip=self._pinned)
            by = "lru"
            if key is None:
                key = index.oldest(skip=lambda ns, t: not self._served_longer(ns, t))
                key, by = key or index.oldest(), "pinned-pressure"
            if key is None:
                break
            ns, tokens = key
            entry = self._pop(ns, tokens, by=by)
            out.append((ns, tokens, entry))
            if by != "lru":
                self._keep_a_shorter_pin(ns, tokens, entry.cache, limit)
        return out

    def _served_longer(self, namespace: Hashable, tokens: list[int]) -> bool:
        longer = self._index.extended(namespace, tokens)
        return longer and _trimmable(self._cache_at(namespace, tokens))

    def _keep_a_shorter_pin(self, namespace: Hashable, tokens: list[int],
                            cache: list[Any] | BlockEntry, limit: int) -> None:
        """Keep the longest live pin within an evicted pinned entry that fits ``limit``
        beside what stays, cut from it (under the lock)."""
        if isinstance(cache, BlockEntry) or not _trimmable(cache):
            return
        for pin in reversed(self.pins.within(self._unspace(namespace), tokens)):
            if len(pin) >= len(tokens) or self._index.get(namespace, list(pin)) is not None:
                continue
            if _nbytes(cache) * len(pin) // len(tokens) > limit - self._index.nbytes:
                continue
            part = _prefix_copy(cache, len(tokens) - len(pin))
            entry = RamEntry(part, "user", False, self.clock())
            self._index.add(namespace, list(pin), Entry(entry, _nbytes(part), "user"))
            return

    def _pop(self, namespace: Hashable, tokens: list[int], by: str | None = None) -> RamEntry:
        got = self._index.pop(namespace, tokens)
        assert got is not None
        if by is not None:  # evicted: its tokens explain a later miss
            self.explainer.evictions.add(namespace, tokens, by)
        entry: RamEntry = got.value
        return entry

    def _entry(self, namespace: Hashable, tokens: list[int]) -> RamEntry:
        got = self._index.get(namespace, tokens)
        assert got is not None
        entry: RamEntry = got.value
        return entry

    def _cache_at(self, namespace: Hashable, tokens: list[int]) -> list[Any] | BlockEntry:
        return self._entry(namespace, tokens).cache

    # -- every entry -----------------------------------------------------------------
    def _entries(self) -> list[tuple[Hashable, list[int], RamEntry]]:
        with self._lock:
            return [(ns, tokens, self._entry(ns, tokens)) for ns, tokens in self._index.stored()]

    def entries(self) -> list[tuple[Hashable, list[int], list[Any]]]:
        """Every RAM entry as ``(namespace, tokens, cache)`` (for tests and tools: the
        stored caches, block entries read into fresh mlx-lm caches)."""
        return [(ns, tokens, e.cache.dense() if isinstance(e.cache, BlockEntry) else e.cache)
                for ns, tokens, e in self._entries()]

    def holds(self, namespace: Hashable, tokens: list[int]) -> bool:
        """Whether RAM holds an entry of exactly ``tokens``."""
        with self._lock:
            return self._index.get(namespace, tokens) is not None

    def clear(self) -> None:
        with self._lock:
            stored = list(self._index.stored())
            gone = [self._entry(ns, t) for ns, t in stored]
            for ns, t in stored:
                self.explainer.evictions.add(ns, t, "cleared")
            self._index.clear()
        for e in gone:
            release(e)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            misses = self.lookups - self.hits - self.ssd_hits
            return {"enabled": self.enabled, "max_bytes": self.max_bytes,
                    "bytes": self._index.nbytes, "entries": len(self._index),
                    "lookups": self.lookups, "hits": self.hits, "ssd_hits": self.ssd_hits,
                    "misses": misses, "hit_tokens": self.hit_tokens,
                    "ssd_hit_tokens": self.ssd_hit_tokens, "ssd_skipped": self.ssd_skipped,
                    "stores": self.stores, "pinned": self.pins.count(),
                    "evicted": dict(self.explainer.evictions.counts),
                    "recent": self.explainer.recent.rows()}


def _nbytes(cache: list[Any] | BlockEntry) -> int:
    if isinstance(cache, BlockEntry):
        return cache.nbytes
    return sum(c.nbytes for c in cache)


def _prefix_copy(cache: list[Any], trim: int) -> list[Any]:
    """A copy of ``cache`` less its last ``trim`` tokens, holding only the bytes of
    what is left (a trimmed KV cache otherwise keeps its whole buffer)."""
    import mlx.core as mx

    part = cache_ops.copy(cache)
    cache_ops.trim(part, trim)
    cache_ops.compact(part)
    mx.eval([c.state for c in part])
    return part


def _trimmable(cache: list[Any] | BlockEntry) -> bool:
    return cache.trimmable if isinstance(cache, BlockEntry) else trimmable(cache)
