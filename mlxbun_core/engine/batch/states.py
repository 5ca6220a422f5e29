"""Recurrent layers' state for a group of rows: what cannot be paged.

A recurrent layer (``ArraysCache``: gated DeltaNet, Mamba) keeps a fixed-size state per
sequence. The decoding rows' states stay merged along the batch axis in one
``ArraysCache`` per layer, in row order, through mlx-lm's own public batch methods
(``merge``, ``extend``, ``filter``, ``extract``); rows joining or leaving change it,
a decode step does not. A prefill pass merges its rows' states for the pass and splits
them back after (``prepare(lengths=...)`` keeps each row's padding out of its state).
"""

from __future__ import annotations

from typing import Any


class StateBatch:
    """The merged recurrent caches of ``uids`` (in order); empty for models without
    recurrent layers (``layers == 0``)."""

    def __init__(self, layers: int):
        self.layers = layers
        self.uids: list[int] = []
        self.caches: list[Any] = []

    def add(self, uid: int, states: list[Any]) -> None:
        """Append row ``uid`` with its single-sequence ``states``."""
        if not self.layers:
            self.uids.append(uid)
            return
        from mlx_lm.models.cache import ArraysCache

        if not self.uids:
            self.caches = [ArraysCache.merge([s]) for s in states]
        else:
            for merged, s in zip(self.caches, states):
                merged.extend(ArraysCache.merge([s]))
        self.uids.append(uid)

    def keep(self, uids: list[int]) -> None:
        """Keep only ``uids`` (a subset, in the current order)."""
        if uids == self.uids:
            return
        index = {u: i for i, u in enumerate(self.uids)}
        picked = [index[u] for u in uids]
        self.uids = list(uids)
        if self.layers and self.uids:
            import mlx.core as mx

            idx = mx.array(picked)
            for c in self.caches:
                c.filter(idx)
        elif not self.uids:
            self.caches = []

    def take(self, uid: int) -> list[Any]:
        """Row ``uid``'s states as single-sequence caches (it stays in the batch)."""
        if not self.layers:
            return []
        i = self.uids.index(uid)
        return [c.extract(i) for c in self.caches]


def merged(states: list[list[Any]], lengths: list[int]) -> list[Any]:
    """One batch cache per recurrent layer over rows' single-sequence ``states``, set to
    read ``lengths[r]`` real positions of row ``r`` in the next pass."""
    from mlx_lm.models.cache import ArraysCache

    out = []
    for layer in zip(*states):
        c = ArraysCache.merge(list(layer))
        c.prepare(lengths=lengths)
        out.append(c)
    return out


def split(caches: list[Any], rows: int) -> list[list[Any]]:
    """The per-row single-sequence states of merged ``caches`` (after a pass)."""
    for c in caches:
        c.finalize()
    return [[c.extract(r) for c in caches] for r in range(rows)]


def pick(caches: list[Any], rows: list[int]) -> list[Any]:
    """The part of merged ``caches`` holding ``rows`` (indices), as caches of its own:
    a pass over some of the rows (see ``Batch._pass``)."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache

    idx = mx.array(rows)

    def part(a: Any) -> Any:
        return None if a is None else a[idx]

    out = []
    for c in caches:
        p = ArraysCache(len(c.cache))
        arrays, left_padding, lengths = c.state
        p.state = ([part(a) for a in arrays], part(left_padding), part(lengths))
        out.append(p)
    return out


def put(caches: list[Any], groups: list[list[int]], parts: list[list[Any]]) -> None:
    """Write the states of ``parts`` (from :func:`pick` of each of ``groups``, after a
    pass) back into the merged ``caches``, in row order."""
    import mlx.core as mx

    order = mx.array(inverse(groups))
    for j, c in enumerate(caches):
        _, left_padding, lengths = c.state
        arrays = [mx.concatenate([p[j].cache[e] for p in parts])[order]
                  for e in range(len(c.cache))]
        c.state = (arrays, left_padding, lengths)


def inverse(groups: list[list[int]]) -> list[int]:
    """Where each row lands in the groups laid end to end (undoes the grouping)."""
    flat = [i for g in groups for i in g]
    out = [0] * len(flat)
    for at, i in enumerate(flat):
        out[i] = at
    return out
