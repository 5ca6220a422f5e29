"""One forward pass over the batch's rows, as the model's layers see it.

mlx-lm's model code talks to a cache object per layer: ``offset`` (where the new tokens
start, for RoPE), ``make_mask`` and ``update_and_fetch``. :class:`PagedLayer` is that
object over the block pool. The tables every layer needs (each row's slots for its new
tokens, its block table, its offset, the mask, the portable path's gather indices) are
built once per pass in :class:`Window` and shared by all layers, so a pass costs one
table build, not one per layer.

A pass feeds every row a window of the same width ``W``; row ``r`` keeps its first
``n[r]`` positions. Positions past that are padding: their keys and values go to the
trash block, and causal masking keeps every real query off them. Keys past a row's
length are masked the same way, so rows of any lengths share a pass with no padding of
their KV (the portable attention still gathers up to the longest row; a kernel over
block tables reads only each row's own).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from . import attention
from .pool import TRASH
from .storage import gather_index

if TYPE_CHECKING:
    from .pool import BlockTable
    from .storage import LayerStore


class Window:
    """The tables of one pass: each row's first position ``starts[r]`` and block ids
    ``row_blocks[r]`` (those the pass reads, in a pool of ``block_size``), ``valid[r]``
    real positions of row ``r`` in a pass of width ``width``. :meth:`over` makes them
    from the rows' block tables, :meth:`plan` gives them back as plain data and
    :meth:`replay` makes them again from that (a distributed follower's pass over its
    own stores)."""

    def __init__(self, block_size: int, starts: list[int], valid: list[int], width: int,
                 row_blocks: list[list[int]]):
        """The tables from plain data (see :meth:`plan`); :meth:`over` makes them from
        the rows' block tables."""
        bs = block_size
        self._plan = (starts, valid, width, row_blocks)
        self.rows, self.width = len(starts), width
        self.starts = np.array(starts, dtype=np.int64)
        nb = _blocks_seen(starts, width, bs)
        blocks = _padded(row_blocks, nb)
        # write slots: (rows, width); padding goes to the trash block's slots
        pos = self.starts[:, None] + np.arange(width)[None, :]
        keep = np.arange(width)[None, :] < np.array(valid)[:, None]
        row_blocks_at = blocks[np.arange(self.rows)[:, None], np.minimum(pos // bs, nb - 1)]
        slots = np.where(keep, row_blocks_at * bs + pos % bs, pos % bs)
        self.write_slots = mx.array(slots.reshape(-1).astype(np.int32))
        self.blocks = mx.array(blocks.astype(np.int32))
        self.key_length = nb * bs
        self.offset = mx.array(self.starts.astype(np.int32))
        self._masks: dict[int | None, mx.array] = {}
        self._gathers: dict[int, mx.array] = {}  # gather_index by heads
        self.direct = False  # layers hand attention their stores (``attention.py``)
        self.kernel_consts: dict[Any, list[mx.array]] = {}  # the kernel's, per pass

    @classmethod
    def over(cls, tables: list[BlockTable], valid: list[int], width: int) -> Window:
        """The window of a pass over ``tables`` (each one's ``length`` is where the pass
        writes), ``valid[r]`` real positions of row ``r`` in a pass of ``width``."""
        bs = tables[0].pool.block_size
        starts = [t.length for t in tables]
        nb = _blocks_seen(starts, width, bs)
        return cls(bs, starts, list(valid), width, [t.blocks[:nb] for t in tables])

    @classmethod
    def replay(cls, plan: tuple[Any, ...], block_size: int) -> Window:
        """The window :meth:`plan` describes, over a pool of ``block_size``."""
        starts, valid, width, blocks, direct = plan
        view = cls(block_size, starts, valid, width, blocks)
        view.direct = direct
        return view

    def plan(self) -> tuple[Any, ...]:
        """``(starts, valid, width, blocks, direct)``: each row's first position, real
        positions and block ids (those the pass reads), the width, direct attention."""
        return (*self._plan, self.direct)

    def gather_index(self, heads: int, block_size: int) -> mx.array:
        """The portable path's gather indices of these tables for ``heads`` KV heads,
        made once per pass: every layer of the pass reads the same blocks (were they
        made per layer, a 36-layer pass built about 800 more graph nodes a step)."""
        got = self._gathers.get(heads)
        if got is None:
            got = self._gathers[heads] = gather_index(self.blocks, block_size, heads)
        return got

    def mask(self, window: int | None = None) -> mx.array:
        """``(rows, 1, width, keys)``: query ``i`` of row ``r`` (at position
        ``start[r] + i``) sees key ``j`` when ``j <= start[r] + i`` (and, for a sliding
        layer, ``j > start[r] + i - window``)."""
        got = self._masks.get(window)
        if got is None:
            q = self.offset[:, None, None, None] + mx.arange(self.width)[None, None, :, None]
            k = mx.arange(self.key_length)[None, None, None, :]
            got = k <= q
            if window is not None:
                got = got & (k > q - window)
            self._masks[window] = got
        return got


def _padded(row_blocks: list[list[int]], nb: int) -> np.ndarray:
    """``(rows, nb)`` block ids, each row's own first and the trash block after them,
    filled in one masked assignment (a row at a time took ~0.5 us a row a pass)."""
    lengths = np.fromiter(map(len, row_blocks), dtype=np.int64, count=len(row_blocks))
    blocks = np.full((len(row_blocks), nb), TRASH, dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(row_blocks), dtype=np.int64,
                       count=int(lengths.sum()))
    blocks[np.arange(nb)[None, :] < lengths[:, None]] = flat
    return blocks


def _blocks_seen(starts: list[int], width: int, block_size: int) -> int:
    """How many blocks of each row's table a pass of ``width`` from ``starts`` reads."""
    return max(1, -(-(max(starts) + width) // block_size))  # (the furthest row reads the most)


class PagedLayer:
    """A layer's cache for one pass (mlx-lm's cache protocol, the parts a forward
    pass uses): writes go to ``store`` at the window's slots, reads gather the rows'
    blocks. ``window``: the layer's sliding window (None: full attention)."""

    def __init__(self, store: LayerStore, view: Window, window: int | None = None):
        self.store, self.view, self.window = store, view, window

    @property
    def offset(self) -> mx.array:
        return self.view.offset

    # Some model code reaches for a cache's arrays between calls: to hang its graph
    # on them (``keys = mx.depends(keys, ...)``) or to drop what it does not need
    # (``values = zeros``). The pool's arrays are the whole pool's and are evaluated
    # after every pass anyway, so reads get them and assignments are ignored.
    @property
    def keys(self) -> mx.array | None:
        return self.store.keys

    @keys.setter
    def keys(self, _: Any) -> None:
        pass

    @property
    def values(self) -> mx.array | None:
        return self.store.values

    @values.setter
    def values(self, _: Any) -> None:
        pass

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        store = self.store
        store.write(self.view.write_slots, keys, values)
        if self.view.direct and attention.direct_fits(store, self.view.width):
            assert store.keys is not None and store.values is not None
            attention.note(store.keys, store, self.view, self.window)
            return store.keys, store.values
        assert store.keys is not None  # (written above)
        index = self.view.gather_index(store.keys.shape[1], store.pool.block_size)
        return store.gather(self.view.blocks, index)

    def make_mask(self, n: int, return_array: bool = False,
                  window_size: int | None = None, **_: Any) -> mx.array:
        return self.view.mask(window_size if window_size is not None else self.window)

    def is_trimmable(self) -> bool:  # asked by some model code before a pass
        return True

    def empty(self) -> bool:
        return False
