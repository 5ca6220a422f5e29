"""Recurrent layers' state for a group of rows: what cannot be paged.

A recurrent layer (``ArraysCache``: gated DeltaNet, Mamba) keeps a fixed-size state per
sequence. The decoding rows' states stay merged along the batch axis in one
``ArraysCache`` per layer, in row order, through mlx-lm's own public batch methods
(``merge``, ``extend``, ``filter``, ``extract``); rows joining or leaving change it,
a decode step does not. A prefill pass merges its rows' states for the pass and splits
them back after (``prepare(lengths=...)`` keeps each row's padding out of its state).

Every such operation goes through :class:`StateOps`, so that with a journal
(``journal.py``) each is also written down as plain data: a distributed follower
applies the same operations to its own states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .journal import Journal


def copy_state(c: Any) -> Any:
    """A copy of a single sequence's recurrent cache (``ArraysCache``). Its arrays are
    shared: model code replaces a state's arrays, it never writes into them."""
    from mlx_lm.models.cache import ArraysCache

    out = ArraysCache(len(c.cache))
    out.cache = list(c.cache)
    return out


class StateOps:
    """The batch's operations on recurrent caches; ``sizes``: each recurrent layer's
    arrays. With ``journal``, each operation is recorded after it succeeds."""

    def __init__(self, sizes: list[int], journal: Journal | None = None):
        self.sizes, self.journal = sizes, journal

    def fresh(self) -> list[Any]:
        """New, empty caches for one row (one per recurrent layer)."""
        return [self._run("new", k) for k in range(len(self.sizes))]

    def copy(self, c: Any) -> Any:
        return self._run("copy", c)

    def merge(self, caches: list[Any]) -> Any:
        return self._run("merge", list(caches))

    def extend(self, c: Any, other: Any) -> None:
        self._run("extend", c, other)

    def filter(self, c: Any, keep: list[int]) -> None:
        self._run("filter", c, list(keep))

    def extract(self, c: Any, i: int) -> Any:
        return self._run("extract", c, i)

    def prepare(self, c: Any, lengths: list[int]) -> None:
        self._run("prepare", c, list(lengths))

    def finalize(self, c: Any) -> None:
        self._run("finalize", c)

    def _run(self, name: str, *args: Any) -> Any:
        out = self.apply(name, args)
        if self.journal is not None:
            self.journal.state_op(name, args, out)
        return out

    def apply(self, name: str, args: tuple[Any, ...] | list[Any]) -> Any:
        """Operation ``name`` on ``args`` (what a follower runs for a recorded one); the
        new cache it makes, or None."""
        from mlx_lm.models.cache import ArraysCache

        if name == "new":
            return ArraysCache(self.sizes[args[0]])
        if name == "copy":
            return copy_state(args[0])
        if name == "merge":
            return ArraysCache.merge(args[0])
        if name == "extract":
            return args[0].extract(args[1])
        c = args[0]
        if name == "extend":
            c.extend(args[1])
        elif name == "filter":
            import mlx.core as mx

            c.filter(mx.array(args[1]))
        elif name == "prepare":
            c.prepare(lengths=args[1])
        elif name == "finalize":
            c.finalize()
        else:
            raise ValueError(f"unknown recurrent state operation {name!r}")
        return None


class StateBatch:
    """The merged recurrent caches of ``uids`` (in order); empty for models without
    recurrent layers (``ops.sizes`` empty)."""

    def __init__(self, ops: StateOps):
        self.ops = ops
        self.layers = len(ops.sizes)
        self.uids: list[int] = []
        self.caches: list[Any] = []

    def add(self, uid: int, states: list[Any]) -> None:
        """Append row ``uid`` with its single-sequence ``states``."""
        if not self.layers:
            self.uids.append(uid)
            return
        if not self.uids:
            self.caches = [self.ops.merge([s]) for s in states]
        else:
            for merged, s in zip(self.caches, states):
                self.ops.extend(merged, self.ops.merge([s]))
        self.uids.append(uid)

    def keep(self, uids: list[int]) -> None:
        """Keep only ``uids`` (a subset, in the current order)."""
        if uids == self.uids:
            return
        index = {u: i for i, u in enumerate(self.uids)}
        picked = [index[u] for u in uids]
        self.uids = list(uids)
        if self.layers and self.uids:
            for c in self.caches:
                self.ops.filter(c, picked)
        elif not self.uids:
            self.caches = []

    def take(self, uid: int) -> list[Any]:
        """Row ``uid``'s states as single-sequence caches (it stays in the batch)."""
        if not self.layers:
            return []
        i = self.uids.index(uid)
        return [self.ops.extract(c, i) for c in self.caches]


def merged(ops: StateOps, states: list[list[Any]], lengths: list[int]) -> list[Any]:
    """One batch cache per recurrent layer over rows' single-sequence ``states``, set to
    read ``lengths[r]`` real positions of row ``r`` in the next pass."""
    out = []
    for layer in zip(*states):
        c = ops.merge(list(layer))
        ops.prepare(c, lengths)
        out.append(c)
    return out


def split(ops: StateOps, caches: list[Any], rows: int) -> list[list[Any]]:
    """The per-row single-sequence states of merged ``caches`` (after a pass)."""
    for c in caches:
        ops.finalize(c)
    return [[ops.extract(c, r) for c in caches] for r in range(rows)]
