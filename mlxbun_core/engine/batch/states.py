"""Recurrent layers' state for a group of rows: what cannot be paged.

A recurrent layer (``ArraysCache``: gated DeltaNet, Mamba) keeps a fixed-size state per
sequence. The decoding rows' states stay merged along the batch axis in one
``ArraysCache`` per layer, in row order, through mlx-lm's own public batch methods
(``merge``, ``extend``, ``filter``, ``extract``); rows joining or leaving change it,
a decode step does not. A prefill pass merges its rows' states for the pass and splits
them back after (``prepare(lengths=...)`` keeps each row's padding out of its state).
A pass over some of the decoding rows takes their part (``pick``) and writes it back
(``put``); a window that rejected drafts puts the state from before it back in those
rows (``copy`` before the window, ``restore`` after it).

Every such operation goes through :class:`StateOps`, so that with a journal
(``journal.py``) each is also written down as plain data: a distributed follower
applies the same operations to its own states.
"""

from __future__ import annotations

from collections.abc import Callable
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

    def pick(self, c: Any, rows: list[int]) -> Any:
        return self._run("pick", c, list(rows))

    def put(self, c: Any, parts: list[Any], groups: list[list[int]]) -> None:
        self._run("put", c, list(parts), [list(g) for g in groups])

    def restore(self, c: Any, saved: Any, rows: list[bool]) -> None:
        self._run("restore", c, saved, list(rows))

    def _run(self, name: str, *args: Any) -> Any:
        out = self.apply(name, args)
        if self.journal is not None:
            self.journal.state_op(name, args, out)
        return out

    def apply(self, name: str, args: tuple[Any, ...] | list[Any]) -> Any:
        """Operation ``name`` on ``args`` (what a follower runs for a recorded one); the
        new cache it makes, or None."""
        if name == "new":
            from mlx_lm.models.cache import ArraysCache

            return ArraysCache(self.sizes[args[0]])
        op = _OPS.get(name)
        if op is None:
            raise ValueError(f"unknown recurrent state operation {name!r}")
        return op(*args)


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


def pick(ops: StateOps, caches: list[Any], rows: list[int]) -> list[Any]:
    """The part of merged ``caches`` holding ``rows`` (indices), as caches of its own:
    a pass over some of the rows (see ``Batch.run_pass``)."""
    return [ops.pick(c, rows) for c in caches]


def put(ops: StateOps, caches: list[Any], groups: list[list[int]],
        parts: list[list[Any]]) -> None:
    """Write the states of ``parts`` (from :func:`pick` of each of ``groups``, after a
    pass) back into the merged ``caches``, in row order."""
    for j, c in enumerate(caches):
        ops.put(c, [p[j] for p in parts], groups)


def inverse(groups: list[list[int]]) -> list[int]:
    """Where each row lands in the groups laid end to end (undoes the grouping)."""
    flat = [i for g in groups for i in g]
    out = [0] * len(flat)
    for at, i in enumerate(flat):
        out[i] = at
    return out


# -- the operations themselves (mlx-lm's public ArraysCache API) ------------------------
def _merge(caches: list[Any]) -> Any:
    from mlx_lm.models.cache import ArraysCache

    return ArraysCache.merge(caches)


def _extend(c: Any, other: Any) -> None:
    c.extend(other)


def _filter(c: Any, keep: list[int]) -> None:
    import mlx.core as mx

    c.filter(mx.array(keep))


def _extract(c: Any, i: int) -> Any:
    return c.extract(i)


def _prepare(c: Any, lengths: list[int]) -> None:
    c.prepare(lengths=lengths)


def _finalize(c: Any) -> None:
    c.finalize()


def _pick(c: Any, rows: list[int]) -> Any:
    """Rows ``rows`` of merged cache ``c`` as a cache of their own."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache

    idx = mx.array(rows)

    def part(a: Any) -> Any:
        return None if a is None else a[idx]

    out = ArraysCache(len(c.cache))
    arrays, left_padding, lengths = c.state
    out.state = ([part(a) for a in arrays], part(left_padding), part(lengths))
    return out


def _put(c: Any, parts: list[Any], groups: list[list[int]]) -> None:
    """``parts`` (one :func:`_pick` of ``c`` per group, after a pass) back into ``c``."""
    import mlx.core as mx

    order = mx.array(inverse(groups))
    _, left_padding, lengths = c.state
    arrays = [mx.concatenate([p.cache[e] for p in parts])[order] for e in range(len(c.cache))]
    c.state = (arrays, left_padding, lengths)


def _restore(c: Any, saved: Any, rows: list[bool]) -> None:
    """Merged cache ``c``'s state from ``saved`` (a copy taken before a pass) in the
    ``rows`` marked; the others keep the pass's. Arrays are immutable, so the copy's
    references are the state as it was."""
    import mlx.core as mx

    mask = mx.array(rows)
    for i, (old, new) in enumerate(zip(saved.cache, c.cache, strict=True)):
        if new is None:
            continue
        before = mx.zeros_like(new) if old is None else old
        c.cache[i] = mx.where(mask.reshape((-1,) + (1,) * (new.ndim - 1)), before, new)


_OPS: dict[str, Callable[..., Any]] = {
    "copy": copy_state, "merge": _merge, "extend": _extend, "filter": _filter,
    "extract": _extract, "prepare": _prepare, "finalize": _finalize, "pick": _pick,
    "put": _put, "restore": _restore}
