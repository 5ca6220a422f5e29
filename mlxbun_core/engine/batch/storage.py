"""Where the blocks' KV lives: one key and one value array per attention layer, a slot
per position of every block (``(capacity * block_size, heads, head_dim)``).

Writes scatter a forward pass's new keys and values into their slots; reads gather a
row's blocks back into the dense ``(rows, heads, positions, head_dim)`` layout mlx-lm's
attention takes (the portable path: plain MLX ops on every backend). The arrays are
made at the first write, when the layer's heads, widths and dtype are known, and grow
with the pool. Moving KV in and out of the pool as mlx-lm's own single-sequence caches
(``KVCache``) is how the prefix cache, the SSD tier and the lone stream meet the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx

if TYPE_CHECKING:
    from .pool import BlockPool


class LayerStore:
    """One attention layer's keys and values for every block of ``pool``."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        """The layer's arrays (none before the first write)."""
        return [] if self.keys is None or self.values is None else [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return int(self.keys.nbytes + self.values.nbytes)

    def bytes_per_block(self) -> int:
        """Bytes one block takes in this layer (0 before the first write)."""
        if self.keys is None or self.values is None:
            return 0
        return self.nbytes // (self.keys.shape[0] // self.pool.block_size)

    def _make(self, keys: mx.array, values: mx.array) -> None:
        slots = self.pool.capacity * self.pool.block_size
        self.keys = mx.zeros((slots, keys.shape[-3], keys.shape[-1]), keys.dtype)
        self.values = mx.zeros((slots, values.shape[-3], values.shape[-1]), values.dtype)

    def fit(self) -> None:
        """Grow the arrays to the pool's capacity (after the pool grew)."""
        if self.keys is None or self.values is None:
            return
        slots = self.pool.capacity * self.pool.block_size
        extra = slots - self.keys.shape[0]
        if extra > 0:
            self.keys = mx.concatenate(
                [self.keys, mx.zeros((extra, *self.keys.shape[1:]), self.keys.dtype)])
            self.values = mx.concatenate(
                [self.values, mx.zeros((extra, *self.values.shape[1:]), self.values.dtype)])

    def keep(self, order: list[int]) -> None:
        """Keep only the blocks ``order`` names, block ``i`` now holding old block
        ``order[i]`` (a compacted or trimmed pool, ``BlockPool.compact``): new, smaller
        arrays, so the old ones go back to MLX once nothing reads them."""
        if self.keys is None or self.values is None:
            return
        index = block_slots(order, self.pool.block_size)
        self.keys = mx.take(self.keys, index, axis=0)
        self.values = mx.take(self.values, index, axis=0)

    def write(self, slots: mx.array, keys: mx.array, values: mx.array) -> None:
        """Store ``keys``/``values`` (``(rows, heads, width, dim)``) at ``slots``
        (``(rows * width,)``, row-major)."""
        if self.keys is None:
            self._make(keys, values)
        assert self.keys is not None and self.values is not None
        b, h, w, _ = keys.shape
        if w == 1:  # a decode step: the same rows without a transpose in the graph
            self.keys[slots] = keys.reshape(b, h, -1)
            self.values[slots] = values.reshape(b, h, -1)
            return
        self.keys[slots] = keys.transpose(0, 2, 1, 3).reshape(b * w, h, -1)
        self.values[slots] = values.transpose(0, 2, 1, 3).reshape(b * w, h, -1)

    def gather(self, blocks: mx.array, index: mx.array | None = None
               ) -> tuple[mx.array, mx.array]:
        """The keys and values of the block tables ``blocks`` (``(rows, n)``), as
        ``(rows, heads, n * block_size, dim)``; ``index``: ``gather_index`` of those
        tables for this layer's heads (a pass's layers share it: ``Window.gather_index``)."""
        assert self.keys is not None and self.values is not None
        bs = self.pool.block_size
        if index is None:
            index = gather_index(blocks, bs, self.keys.shape[1])
        return (gathered(self.keys, blocks, bs, index),
                gathered(self.values, blocks, bs, index))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy each ``old`` block's contents into ``new`` (copy on write)."""
        if not pairs or self.keys is None or self.values is None:
            return
        bs = self.pool.block_size
        src = mx.array([o * bs + i for o, _ in pairs for i in range(bs)])
        dst = mx.array([n * bs + i for _, n in pairs for i in range(bs)])
        self.keys[dst] = self.keys[src]
        self.values[dst] = self.values[src]

    def export(self, blocks: list[int], length: int) -> tuple[mx.array, mx.array]:
        """The first ``length`` positions of ``blocks`` as ``(1, heads, length, dim)``."""
        table = mx.array([blocks], dtype=mx.int32)
        k, v = self.gather(table)
        return mx.contiguous(k[:, :, :length]), mx.contiguous(v[:, :, :length])


def block_slots(blocks: list[int], block_size: int) -> mx.array:
    """The storage slots of ``blocks``, in order (every position of each)."""
    ids = mx.array(blocks, dtype=mx.int32)
    return (ids[:, None] * block_size + mx.arange(block_size, dtype=mx.int32)).reshape(-1)


def gather_index(blocks: mx.array, block_size: int, heads: int) -> mx.array:
    """The flat (slot, head) indices :func:`gathered` takes for the block tables ``blocks``
    (``(rows, n)``), row by row, head by head, position by position."""
    rows, n = blocks.shape
    slots = (blocks[:, :, None] * block_size + mx.arange(block_size)[None, None, :]
             ).reshape(rows, 1, n * block_size)
    return (slots * heads + mx.arange(heads)[None, :, None]).reshape(-1)


def gathered(store: mx.array, blocks: mx.array, block_size: int, index: mx.array) -> mx.array:
    """The rows' positions as a contiguous ``(rows, heads, positions, dim)``: one take of
    ``dim``-long rows at (slot, head) indices, so attention reads it without striding (a
    transposed view of a ``(rows, positions, heads, dim)`` gather made MLX's CPU attention
    3.5x slower). ``index``: :func:`gather_index` of ``blocks`` for ``store``'s heads."""
    rows, n = blocks.shape
    heads, dim = store.shape[1], store.shape[2]
    picked = mx.take(store.reshape(-1, dim), index, axis=0)
    return picked.reshape(rows, heads, n * block_size, dim)


def kv_of(cache: Any) -> tuple[mx.array, mx.array] | None:
    """The keys and values an mlx-lm ``KVCache`` holds (``(1, heads, n, dim)``), or None
    when it holds nothing."""
    if cache.keys is None or not cache.offset:
        return None
    return cache.keys[..., :cache.offset, :], cache.values[..., :cache.offset, :]
