"""The prefix KV cache: reuse the KV of the longest cached prefix of a prompt.

A byte-capped LRU over mlx-lm's own ``LRUPromptCache`` (a token trie per
namespace). The namespace keeps apart what must never share KV: different
models, adapters, KV settings and media. Works for every cache kind mlx-lm uses:

- trimmable caches (full attention; sliding windows that have not wrapped) are
  stored after generation and trimmed back to the common prefix on a hit;
- caches that cannot rewind (recurrent / linear-attention state, wrapped
  windows) are also snapshotted at the prompt boundary, so the next turn, which
  extends this prompt, finds an exact prefix.

Lookups always leave at least the prompt's last token to feed the model, so a
hit still yields the logits of the first new token.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

log = logging.getLogger("mlxbun.cache")

# A prompt that shares fewer tokens than this with the cache (and not all but its last),
# and holds no whole cached entry, starts cold: mlx-lm's search for the entry extending a
# short common prefix walks that entry's whole tail (30-120 ms for a 5k-token
# conversation, measured on an H200 host and on this CPU) to save a few tokens of prefill.
MIN_HIT = 64


class PrefixCache:
    def __init__(self, max_bytes: int):
        from mlx_lm.models.cache import LRUPromptCache

        self.max_bytes = max_bytes
        self._lru = LRUPromptCache(max_size=1 << 20, max_bytes=max_bytes)
        self._lock = threading.Lock()  # /stats reads from the event loop
        self.lookups = self.hits = self.hit_tokens = self.stores = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def lookup(self, namespace, tokens: list) -> tuple[Optional[list], int]:
        """``(cache, n)``: a private cache holding ``tokens[:n]``, or ``(None, 0)``."""
        if not self.enabled or len(tokens) < 2:
            return None, 0
        with self._lock:
            self.lookups += 1
            shared, whole_entry = self._shared(namespace, tokens)
            if shared < min(MIN_HIT, len(tokens) - 1) and not whole_entry:
                return None, 0
            cache, rest = self._lru.fetch_nearest_cache(namespace, tokens)
            if cache is not None and not rest:  # exact: the last token must still be fed
                if trimmable(cache):
                    from mlx_lm.models.cache import trim_prompt_cache

                    trim_prompt_cache(cache, 1)
                    rest = tokens[-1:]
                else:
                    cache, rest = self._lru.fetch_nearest_cache(namespace, tokens[:-1])
                    rest = list(rest) + tokens[-1:]
        if cache is None:
            return None, 0
        n = len(tokens) - len(rest)
        if n <= 0:
            return None, 0
        with self._lock:
            self.hits += 1
            self.hit_tokens += n
        return cache, n

    def _shared(self, namespace, tokens: list) -> tuple[int, bool]:
        """How many leading ``tokens`` some entry shares, and whether a whole entry lies
        within them (a walk down mlx-lm's trie)."""
        try:
            node = self._lru._trie._trie.get(namespace)
        except AttributeError:  # another mlx-lm layout: let its own search decide
            return len(tokens), True
        n, whole = 0, False
        while node is not None and n < len(tokens):
            node = node.get(tokens[n])
            if node is not None:
                n += 1
                whole = whole or "__value__" in node
        return n, whole

    def store(self, namespace, tokens: list, cache: list, *, boundary: bool = False) -> None:
        """Keep ``cache`` (which holds exactly ``tokens``); evicts least recently used."""
        if not self.enabled or not tokens or not cache:
            return
        import mlx.core as mx

        # a row taken out of a batch is a lazy slice of the whole batch's KV: evaluated
        # here it owns its bytes, unevaluated it would pin every row's (and its byte
        # count would not say so)
        mx.eval([c.state for c in cache])
        with self._lock:
            self._lru.insert_cache(namespace, list(tokens), cache,
                                   cache_type="user" if boundary else "assistant")
            self.stores += 1

    def clear(self) -> None:
        with self._lock:
            self._lru.trim_to(n_sequences=0)

    def stats(self) -> dict:
        with self._lock:
            return {"enabled": self.enabled, "max_bytes": self.max_bytes,
                    "bytes": self._lru.nbytes, "entries": len(self._lru),
                    "lookups": self.lookups, "hits": self.hits,
                    "hit_tokens": self.hit_tokens, "stores": self.stores}


def trimmable(cache: list) -> bool:
    from mlx_lm.models.cache import can_trim_prompt_cache

    return can_trim_prompt_cache(cache)
