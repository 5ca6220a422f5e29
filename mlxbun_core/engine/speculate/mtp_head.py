"""The MTP rows' head caches on the batch lane, paged like the target's KV.

The head keeps a row of KV per target position it has read (the target's state at
``p`` paired with the token at ``p + 1``). On the batch lane every MTP row's head KV
lives in blocks of a pool of the head's own, through the engine's batch pieces
(``engine/batch``: block tables, layer storage, the pass tables; the head's decoder
layer sees a ``PagedLayer`` as the target's layers do). Rows that append different
numbers of positions in one call share it with no padding of their KV (the padding is
written to the trash block), and the head holds exactly what admission bills for it
(``kv_bytes_per_token`` a position read).

A call appends ``valid[r]`` positions to row ``r``; a chained draft appends one more
on top, and the chain's positions are dropped after it (the table's length put back:
the next call writes over them). A row's head moves in and out as the mlx-lm caches
the lone stream keeps (``Layout.load``/``export``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..batch import BLOCK_SIZE, FIRST_BLOCKS, NO_LIMIT
from ..batch.layout import PAGED, Layout, Slot, slots_of
from ..batch.pool import BlockPool, BlockTable, OutOfBlocks
from ..batch.view import Window

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import TokenPredictor


def pageable(caches: list[Any]) -> list[Slot] | None:
    """A head's cache (``make_cache()``) as pageable layers: plain KV layers, or a
    ``CacheList`` of them (an MLA layer and its sparse-attention indexer, as GLM-5's MTP
    layer keeps); None when some layer cannot be paged."""
    slots = slots_of(caches)
    if not caches or slots is None or any(s.kind != PAGED or s.window for s in slots):
        return None
    return slots


def held(cache: list[Any]) -> int:
    """Positions an mlx-lm head cache holds (its first layer's, a ``CacheList``'s first
    part's)."""
    first = cache[0]
    return int(getattr(first, "caches", [first])[0].offset)


class HeadPages:
    """Every MTP row's head KV: a block table per row over one pool (``slots``: the
    head's cache layers, :func:`pageable`)."""

    def __init__(self, predictor: TokenPredictor, slots: list[Slot]):
        self.predictor = predictor
        self.pool = BlockPool(BLOCK_SIZE, FIRST_BLOCKS, NO_LIMIT)
        self.layout = Layout(slots, self.pool)
        self.tables: dict[int, BlockTable] = {}

    def add(self, uid: int, cache: list[Any] | None = None) -> None:
        """Start row ``uid``'s head, from a lone stream's head ``cache`` (None: empty)."""
        table = BlockTable(self.pool)
        count = 0 if cache is None else held(cache)
        if count:
            assert cache is not None
            self._reserve([table], [count])
            self.layout.load(table, cache, count)
        self.tables[uid] = table

    def drop(self, uid: int) -> None:
        table = self.tables.pop(uid, None)
        if table is not None:
            table.free()

    def length(self, uid: int) -> int:
        """Positions row ``uid``'s head holds."""
        return self.tables[uid].length

    def export(self, uid: int) -> list[Any]:
        """Row ``uid``'s head as fresh mlx-lm caches (the row goes on)."""
        table = self.tables[uid]
        if not table.length:
            return self.predictor.make_cache()
        return self.layout.export(table, [])

    def append(self, uids: list[int], hidden: mx.array, tokens: mx.array,
               valid: list[int]) -> tuple[mx.array, mx.array]:
        """Append ``valid[r]`` pairs of ``hidden[r]`` and ``tokens[r]`` (``(rows, width,
        H)`` and ``(rows, width)``, right-padded) to row ``uids[r]``'s head: the
        predictor's logits at the last column and its states at every one."""
        tables = [self.tables[u] for u in uids]
        width = int(tokens.shape[1])
        self._reserve(tables, [width] * len(tables))
        # (the heads' layout has no KV scheme: its stores are plain)
        caches = self.layout.caches(Window.over(tables, valid, width), [])
        out = self.predictor.predict(hidden, tokens, caches)
        for t, n in zip(tables, valid):
            t.length += n
        return out

    def rewind(self, uids: list[int], lengths: list[int]) -> None:
        """Put rows' lengths back (a chain's positions are written over next time)."""
        for u, n in zip(uids, lengths):
            self.tables[u].length = n

    def arrays(self) -> list[mx.array]:
        return [a for s in self.layout.all_stores() for a in s.arrays()]

    def _reserve(self, tables: list[BlockTable], widths: list[int]) -> None:
        """Blocks for every table's next ``widths`` positions, growing the pool (doubling)
        if it must."""
        pool = self.pool
        need = sum(max(0, pool.blocks_for(t.length + w) - len(t.blocks))
                   for t, w in zip(tables, widths))
        if need > pool.free:
            if pool.limit - pool.capacity < need - pool.free:
                raise OutOfBlocks(need, pool.room)
            self.layout.grow(pool.capacity + max(need - pool.free, pool.capacity))
        for t, w in zip(tables, widths):
            t.reserve(t.length + w)
