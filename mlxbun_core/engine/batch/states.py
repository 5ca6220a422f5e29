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
