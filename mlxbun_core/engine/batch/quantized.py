"""Quantized blocks (``--kv-quant 4|8``): a full-attention layer's keys and values kept
in the pool as mlx-lm's ``(packed, scales, biases)`` triples, one slot per position.

A position is quantized exactly as mlx-lm's ``QuantizedKVCache`` quantizes it
(``mx.quantize`` with the scheme's bits and group along the head dimension), so its
numbers never depend on other rows or positions, and a row's blocks hold what mlx-lm's
own cache would hold for the same tokens. The layer's cache object for a pass carries
``bits`` and ``group_size``: that is what sends mlx-lm's attention
(``mlx_lm.models.base.scaled_dot_product_attention``) to its quantized path, over the
rows' blocks gathered as triples.

mlx-lm quantizes a cache after each forward pass, so a fresh sequence's first pass
attends over its own keys in full precision. A pass whose rows all start empty does the
same here, every paged layer with mlx-lm's own first-pass masks
(:class:`FirstPassLayer`); the executor gives fresh rows a pass of their own rather than
mix them with rows that already hold quantized KV (``Batch.run_pass``).

A layer whose head dimension does not divide into groups keeps its dtype (as the serial
lane leaves it): the store finds out at its first write and from then on is a plain
:class:`~.storage.LayerStore` (``plain``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ...kvquant import quantizable, rotatable_dims
from ...kvquant.turbo import encode, restore
from .storage import LayerStore, block_slots, gather_index, gathered
from .view import PagedLayer

if TYPE_CHECKING:
    from .pool import BlockPool
    from .view import Window

Triple = tuple[mx.array, mx.array, mx.array]
"""mlx-lm's quantized form of an array: (packed uint32, scales, biases)."""


class QuantizedStore:
    """One full-attention layer's quantized keys and values for every block of ``pool``:
    ``parts`` holds the keys' triple then the values', each ``(slots, heads, ·)``."""

    def __init__(self, pool: BlockPool, bits: int, group_size: int,
                 value_bits: int | None = None, rotate: bool = False):
        self.pool, self.bits, self.group_size = pool, bits, group_size
        # turbo (``kvquant.turbo``): values at their own bits, both rotated first
        self.value_bits, self.rotate = value_bits or bits, rotate
        self.parts: list[mx.array] = []
        self.plain = LayerStore(pool)  # used instead when the head dims do not divide
        self.quantized: bool | None = None  # decided by the first write

    def arrays(self) -> list[mx.array]:
        return self.parts + self.plain.arrays()

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays())

    def bytes_per_block(self) -> int:
        """Bytes one block takes in this layer (0 before the first write)."""
        if not self.parts:
            return self.plain.bytes_per_block()
        return self.nbytes // (self.parts[0].shape[0] // self.pool.block_size)

    def fit(self) -> None:
        """Grow the arrays to the pool's capacity (after the pool grew)."""
        self.plain.fit()
        if not self.parts:
            return
        extra = self.pool.capacity * self.pool.block_size - self.parts[0].shape[0]
        if extra > 0:
            self.parts = [mx.concatenate([a, mx.zeros((extra, *a.shape[1:]), a.dtype)])
                          for a in self.parts]

    def keep(self, order: list[int]) -> None:
        """Keep only the blocks ``order`` names (``LayerStore.keep``)."""
        self.plain.keep(order)
        if self.parts:
            index = block_slots(order, self.pool.block_size)
            self.parts = [mx.take(a, index, axis=0) for a in self.parts]

    def write(self, slots: mx.array, keys: mx.array | Triple,
              values: mx.array | Triple) -> None:
        """Store ``keys``/``values`` (``(rows, heads, width, dim)``, or triples of that
        shape already quantized) at ``slots`` (``(rows * width,)``, row-major)."""
        if self.quantized is None:
            self._decide(keys, values)
        if not self.quantized:
            assert isinstance(keys, mx.array) and isinstance(values, mx.array)
            return self.plain.write(slots, keys, values)
        parts = [*self._quantized(keys, self.bits), *self._quantized(values, self.value_bits)]
        if not self.parts:
            size = self.pool.capacity * self.pool.block_size
            self.parts = [mx.zeros((size, p.shape[1], p.shape[-1]), p.dtype) for p in parts]
        for store, p in zip(self.parts, parts):
            b, h, w, d = p.shape
            store[slots] = p.transpose(0, 2, 1, 3).reshape(b * w, h, d)

    def _decide(self, keys: mx.array | Triple, values: mx.array | Triple) -> None:
        if isinstance(keys, tuple):  # already quantized: mlx-lm's own cache
            self.quantized = True
            return
        assert isinstance(values, mx.array)
        dims = (keys.shape[-1], values.shape[-1])
        self.quantized = quantizable(dims, self.group_size) and (
            not self.rotate or rotatable_dims(dims))

    def _quantized(self, x: mx.array | Triple, bits: int) -> Triple:
        if isinstance(x, tuple):
            return x
        if self.rotate:
            return encode(x, bits, self.group_size)
        packed, scales, biases = mx.quantize(x, group_size=self.group_size, bits=bits)
        return packed, scales, biases

    def gather(self, blocks: mx.array) -> tuple[Triple, Triple]:
        """The keys' and values' triples of the block tables ``blocks`` (``(rows, n)``),
        each ``(rows, heads, n * block_size, ·)``."""
        bs = self.pool.block_size
        index = gather_index(blocks, bs, self.parts[0].shape[1])  # (every part's heads)
        k0, k1, k2, v0, v1, v2 = (gathered(a, blocks, bs, index) for a in self.parts)
        return (k0, k1, k2), (v0, v1, v2)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy each ``old`` block's contents into ``new`` (copy on write)."""
        self.plain.copy_blocks(pairs)
        if not pairs or not self.parts:
            return
        bs = self.pool.block_size
        src = mx.array([o * bs + i for o, _ in pairs for i in range(bs)])
        dst = mx.array([n * bs + i for _, n in pairs for i in range(bs)])
        for a in self.parts:
            a[dst] = a[src]

    def export(self, blocks: list[int], length: int) -> tuple[Triple, Triple]:
        """The first ``length`` positions of ``blocks``, each part ``(1, heads, length, ·)``."""
        keys, values = self.gather(mx.array([blocks], dtype=mx.int32))

        def cut(t: Triple) -> Triple:
            a, b, c = (mx.contiguous(x[:, :, :length]) for x in t)
            return a, b, c

        return cut(keys), cut(values)


class _PassLayer:
    """What both layer objects here share: the pass's offsets, the store's arrays."""

    def __init__(self, store: LayerStore | QuantizedStore, view: Window):
        self.store, self.view = store, view

    @property
    def offset(self) -> mx.array:
        return self.view.offset

    # (see ``PagedLayer.keys``: model code may read the arrays; assignments are ignored)
    @property
    def keys(self) -> Any:
        s = self.store
        return _triple(s.parts[:3]) if isinstance(s, QuantizedStore) else s.keys

    @keys.setter
    def keys(self, _: Any) -> None:
        pass

    @property
    def values(self) -> Any:
        s = self.store
        return _triple(s.parts[3:]) if isinstance(s, QuantizedStore) else s.values

    @values.setter
    def values(self, _: Any) -> None:
        pass

    def is_trimmable(self) -> bool:
        return True

    def empty(self) -> bool:
        return False


class QuantizedLayer(_PassLayer):
    """A quantized layer's cache for a pass over rows that hold KV already: new keys
    are quantized into their slots and attention runs over the rows' triples."""

    def __init__(self, store: QuantizedStore, view: Window):
        super().__init__(store, view)
        self.blocks = store  # (typed as what it is)
        self.bits, self.group_size = store.bits, store.group_size

    def make_mask(self, n: int, return_array: bool = False,
                  window_size: int | None = None, **_: Any) -> mx.array:
        return self.view.mask(window_size)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        self.blocks.write(self.view.write_slots, keys, values)
        return self.blocks.gather(self.view.blocks)


class RotatedLayer(_PassLayer):
    """A turbo layer's cache for a pass over rows that hold KV already: new keys are
    rotated and quantized into their slots, and attention reads the rows' blocks
    dequantized and turned back, in the activation dtype (no ``bits``: mlx-lm's
    float attention)."""

    def __init__(self, store: QuantizedStore, view: Window, window: int | None):
        super().__init__(store, view)
        self.blocks, self.window = store, window

    def make_mask(self, n: int, return_array: bool = False,
                  window_size: int | None = None, **_: Any) -> mx.array:
        return self.view.mask(window_size or self.window)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        s = self.blocks
        s.write(self.view.write_slots, keys, values)
        k, v = s.gather(self.view.blocks)
        return restore(k, s.bits, s.group_size), restore(v, s.value_bits, s.group_size)


class FirstPassLayer(_PassLayer):
    """Any paged layer's cache for a pass whose rows all start empty, under a KV scheme:
    the keys go to their slots (quantized where the store quantizes), and the pass
    attends over them as computed with mlx-lm's own first-pass masks, exactly as
    mlx-lm's first pass over fresh caches (``KVCache``, or ``RotatingKVCache`` for a
    sliding ``window``) attends. Padding sits at the end of a row's window, so the
    causal mask keeps every real query off it."""

    def __init__(self, store: LayerStore | QuantizedStore, view: Window, window: int | None):
        super().__init__(store, view)
        self.window = window

    def make_mask(self, n: int, return_array: bool = False,
                  window_size: int | None = None, **_: Any) -> Any:
        from mlx_lm.models.base import create_causal_mask
        from mlx_lm.models.cache import create_attention_mask

        if self.window is None:  # KVCache.make_mask at offset 0
            return create_attention_mask(n, 0, return_array, window_size)
        if n == 1:  # RotatingKVCache.make_mask at offset 0
            return None
        window = window_size or self.window
        return (create_causal_mask(n, 0, window_size=window) if n > window or return_array
                else "causal")

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.store.write(self.view.write_slots, keys, values)
        return keys, values


def _triple(parts: list[mx.array]) -> Triple | None:
    if not parts:
        return None
    a, b, c = parts
    return a, b, c


def layer_for(store: LayerStore | QuantizedStore, view: Window, window: int | None,
              first: bool) -> Any:
    """A paged layer's cache object for the pass ``view`` under a KV scheme (``first``:
    the pass's rows all start empty)."""
    if first:
        return FirstPassLayer(store, view, window)
    if not isinstance(store, QuantizedStore):
        return PagedLayer(store, view, window)
    if store.quantized is False:
        return PagedLayer(store.plain, view, window)
    assert store.quantized, "rows hold KV that was never written"
    return RotatedLayer(store, view, window) if store.rotate else QuantizedLayer(store, view)
