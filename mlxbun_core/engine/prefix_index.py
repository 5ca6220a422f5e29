"""The prefix cache's index: entries by namespace and token sequence, in a token trie,
with their eviction order. No KV lives here; an entry is whatever the cache stores.

:meth:`PrefixIndex.search` answers, for a prompt, the entry that equals it, the
longest entry that is a prefix of it, and the shortest entry extending the longest
path the prompt shares with any entry (with that path's length): the three ways a
cached prefix can serve a prompt. Entries leave in insertion order per kind, the kind
with more entries first ("assistant" turns before "user" prompt boundaries before
"system" prompts), which keeps the turns an agent will resend longest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

KINDS = ("assistant", "user", "system")
Keep = Callable[[Hashable, list[int]], bool]  # names entries to spare (pinned ones)
_VALUE = object()  # the trie node's key for the entry stored there


@dataclass
class Found:
    """What :meth:`PrefixIndex.search` found for a prompt (token lists, or None)."""

    exact: list[int] | None
    shorter: list[int] | None  # the longest entry that is a prefix of the prompt
    longer: list[int] | None  # the shortest entry extending the shared path
    common_prefix: int  # tokens the prompt shares with the trie's deepest path


@dataclass
class Entry:
    """A stored value and its size and kind (see ``KINDS``)."""

    value: Any
    nbytes: int
    kind: str


class PrefixIndex:
    def __init__(self) -> None:
        self._roots: dict[Hashable, dict[Any, Any]] = {}
        self._order: dict[str, deque[tuple[Hashable, tuple[int, ...]]]] = {
            k: deque() for k in KINDS}
        self.nbytes = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._order.values())

    def stored(self) -> Iterator[tuple[Hashable, list[int]]]:
        """Every entry's ``(namespace, tokens)``, oldest first within each kind."""
        for q in self._order.values():
            for ns, tokens in q:
                yield ns, list(tokens)

    # -- the trie --------------------------------------------------------------------
    def _node(self, namespace: Hashable, tokens: list[int]) -> dict[Any, Any] | None:
        node = self._roots.get(namespace)
        for t in tokens:
            if node is None:
                return None
            node = node.get(t)
        return node

    def get(self, namespace: Hashable, tokens: list[int]) -> Entry | None:
        node = self._node(namespace, tokens)
        return None if node is None else node.get(_VALUE)

    def search(self, namespace: Hashable, tokens: list[int]) -> Found:
        node = self._roots.get(namespace)
        if node is None:
            return Found(None, None, None, 0)
        last, i = -1, 0
        while i < len(tokens) and tokens[i] in node:
            node = node[tokens[i]]
            if _VALUE in node:
                last = i
            i += 1
        if tokens and last == len(tokens) - 1:
            return Found(list(tokens), None, None, 0)
        shorter = list(tokens[:last + 1]) if last > 0 else None
        longer = None
        if i > 0:
            tail = _shortest_tail(node)
            longer = None if tail is None else list(tokens[:i]) + tail
        return Found(None, shorter, longer, i)

    def extended(self, namespace: Hashable, tokens: list[int]) -> bool:
        """Whether another entry strictly extends ``tokens``."""
        node = self._roots.get(namespace)
        for t in tokens:
            if node is None or t not in node:
                return False
            node = node[t]
        return node is not None and any(k is not _VALUE for k in node)

    def shared(self, namespace: Hashable, tokens: list[int]) -> tuple[int, bool]:
        """How many leading ``tokens`` some entry shares, and whether a whole entry lies
        within them."""
        n, whole, _ = self.walk(namespace, tokens)
        return n, whole

    def walk(self, namespace: Hashable, tokens: list[int]
             ) -> tuple[int, bool, dict[Any, Any] | None]:
        """:meth:`shared`, and the trie node where the prompt leaves the cache (None:
        the namespace holds nothing)."""
        node = self._roots.get(namespace)
        n, whole = 0, False
        while node is not None and n < len(tokens):
            child = node.get(tokens[n])
            if child is None:
                break
            node, n = child, n + 1
            whole = whole or _VALUE in node
        return n, whole, node

    # -- for explanations (never on the lookup path) ----------------------------------
    def namespaces(self) -> list[Hashable]:
        return list(self._roots)

    @staticmethod
    def branches(node: dict[Any, Any] | None) -> bool:
        """Whether some entry goes on past ``node`` (a node :meth:`walk` returned)."""
        return node is not None and any(t is not _VALUE for t in node)

    @staticmethod
    def continuation(node: dict[Any, Any] | None, limit: int) -> list[int]:
        """Up to ``limit`` tokens an entry holds past ``node`` (one path of many)."""
        out: list[int] = []
        while node is not None and len(out) < limit:
            t = next((t for t in node if t is not _VALUE), None)
            if t is None:
                break
            out.append(t)
            node = node[t]
        return out

    # -- entries ---------------------------------------------------------------------
    def add(self, namespace: Hashable, tokens: list[int], entry: Entry,
            drop_prefixes: bool = False, keep: Keep | None = None) -> list[Entry]:
        """Store ``entry`` at ``tokens`` (replacing one there); with ``drop_prefixes``
        also remove every entry that is a prefix of ``tokens`` (a trimmable entry
        serves them all) but those ``keep`` names (pinned ones). The entries removed."""
        removed = []
        old = self.pop(namespace, tokens)
        if old is not None:
            removed.append(old)
        node = self._roots.setdefault(namespace, {})
        for i, t in enumerate(tokens):
            if (drop_prefixes and i > 0 and _VALUE in node
                    and not (keep is not None and keep(namespace, tokens[:i]))):
                removed.append(self._detach(namespace, tokens[:i], node))
            node = node.setdefault(t, {})
        node[_VALUE] = entry
        self._order[entry.kind].append((namespace, tuple(tokens)))
        self.nbytes += entry.nbytes
        return removed

    def _detach(self, namespace: Hashable, tokens: list[int], node: dict[Any, Any]) -> Entry:
        entry: Entry = node.pop(_VALUE)
        self._order[entry.kind].remove((namespace, tuple(tokens)))
        self.nbytes -= entry.nbytes
        return entry

    def pop(self, namespace: Hashable, tokens: list[int]) -> Entry | None:
        """Remove the entry at ``tokens`` (None: there is none), pruning empty nodes."""
        root = self._roots.get(namespace)
        if root is None:
            return None
        path = [root]
        for t in tokens:
            nxt = path[-1].get(t)
            if nxt is None:
                return None
            path.append(nxt)
        if _VALUE not in path[-1]:
            return None
        entry = self._detach(namespace, tokens, path[-1])
        for i in range(len(tokens), 0, -1):
            if path[i]:
                break
            del path[i - 1][tokens[i - 1]]
        if not root:
            del self._roots[namespace]
        return entry

    def oldest(self, skip: Keep | None = None) -> tuple[Hashable, list[int]] | None:
        """The entry to evict next: the oldest of the first kind that has at least as
        many entries as the next kind (the last kind otherwise); entries ``skip`` names
        (pinned ones) are passed over, as if they were not there."""
        heads = {k: self._first(k, skip) for k in KINDS}
        counts = {k: len(self._order[k]) if skip is None else
                  sum(1 for ns, t in self._order[k] if not skip(ns, list(t))) for k in KINDS}
        for a, b in zip(KINDS, KINDS[1:]):
            head = heads[a]
            if head is not None and counts[a] >= counts[b]:
                return head
        for k in reversed(KINDS):
            if heads[k] is not None:
                return heads[k]
        return None

    def _first(self, kind: str, skip: Keep | None) -> tuple[Hashable, list[int]] | None:
        for ns, tokens in self._order[kind]:
            if skip is None or not skip(ns, list(tokens)):
                return ns, list(tokens)
        return None

    def clear(self) -> None:
        self._roots.clear()
        for q in self._order.values():
            q.clear()
        self.nbytes = 0


def _shortest_tail(node: dict[Any, Any]) -> list[int] | None:
    """The shortest token path from ``node`` down to a stored entry."""
    best: list[int] | None = None
    stack: list[tuple[dict[Any, Any], list[int]]] = [(node, [])]
    while stack:
        cur, extra = stack.pop()
        if _VALUE in cur:
            if best is None or len(extra) < len(best):
                best = extra
        elif best is None or len(extra) < len(best):
            stack += [(cur[t], extra + [t]) for t in cur if t is not _VALUE]
    return best
