"""Quantized KV for mlx-lm's ``BatchGenerator``: a batched ``QuantizedKVCache``.

mlx-lm batches plain KV (``BatchKVCache``: left-padded rows, per-row offsets) and
quantizes single sequences (``QuantizedKVCache``), but has no batched quantized
cache. :class:`BatchQuantizedKVCache` is ``BatchKVCache`` with each of keys and values
held as mlx-lm's ``(packed uint32, scales, biases)`` triple, quantized exactly as
``QuantizedKVCache`` quantizes them (groups run along the head dimension, so a row's
numbers never depend on the other rows). It carries ``bits`` and ``group_size``, which
is what sends mlx-lm's attention to ``quantized_scaled_dot_product_attention``.

Rows reach the batch through ``merge`` of the first row's cache class, so rows are
adopted into :class:`PlainRowKVCache` / :class:`QuantizedRowKVCache`, whose ``merge``
takes a mix of quantized and not-yet-quantized rows. Rows leaving the batch
(``extract``) are mlx-lm's own ``QuantizedKVCache``.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
from mlx.utils import tree_map, tree_reduce
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    BatchKVCache,
    KVCache,
    QuantizedKVCache,
    _BaseCache,
    dynamic_roll,
)


def merge_rows(caches: list):
    """One batch cache from per-row caches: quantized if any row is (the others are
    quantized to match), else mlx-lm's ``BatchKVCache``."""
    quant = [c for c in caches if isinstance(c, QuantizedKVCache)]
    if not quant:
        return BatchKVCache.merge(caches)
    g, b = quant[0].group_size, quant[0].bits
    rows = [c if isinstance(c, QuantizedKVCache) else c.to_quantized(group_size=g, bits=b)
            for c in caches]
    return BatchQuantizedKVCache.merge(rows)


class PlainRowKVCache(KVCache):
    """A row's unquantized KV that may be merged with quantized rows."""

    @classmethod
    def merge(cls, caches):
        return merge_rows(caches)


class QuantizedRowKVCache(QuantizedKVCache):
    """A row's quantized KV that mlx-lm's ``BatchGenerator`` can merge."""

    @classmethod
    def merge(cls, caches):
        return merge_rows(caches)

    def size(self) -> int:
        return self.offset


_PLAIN_ROWS = (PlainRowKVCache,)


def adopt(c):
    """``c`` as a row class with a mixing ``merge`` (other cache kinds unchanged)."""
    if type(c) is KVCache:
        return PlainRowKVCache.from_state(c.state)
    if type(c) is QuantizedKVCache:
        return QuantizedRowKVCache.from_state(c.state)
    return c


def to_quantized(c, group_size: int, bits: int) -> QuantizedKVCache:
    """mlx-lm's own conversion of a single sequence's ``KVCache``."""
    return c.to_quantized(group_size=group_size, bits=bits)


def _zeros_like_rows(x: mx.array, rows: int, length: int) -> mx.array:
    return mx.zeros((rows, x.shape[1], length, x.shape[-1]), dtype=x.dtype)


class BatchQuantizedKVCache(_BaseCache):
    step = 256

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8):
        # (packed, scales, biases), each (B, H, T, ·)
        self.keys: tuple[mx.array, ...] | None = None
        self.values: tuple[mx.array, ...] | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding = None
        self.group_size, self.bits = group_size, bits

    @classmethod
    def from_plain(cls, c: BatchKVCache, group_size: int, bits: int) -> BatchQuantizedKVCache:
        """``c`` (a ``BatchKVCache``) quantized, padding and offsets kept."""
        q = cls.__new__(cls)
        q.group_size, q.bits = group_size, bits
        q.keys = q.values = None
        if c.keys is not None:
            q.keys = mx.quantize(c.keys, group_size=group_size, bits=bits)
            q.values = mx.quantize(c.values, group_size=group_size, bits=bits)
        q.offset, q.left_padding, q._idx = c.offset, c.left_padding, c._idx
        q._right_padding = c._right_padding
        return q

    # -- the model's view --------------------------------------------------------
    def update_and_fetch(self, keys, values):
        B, H, S, dk = keys.shape
        prev = self._idx
        if self.keys is None or prev + S > self.keys[0].shape[2]:
            self._grow(B, H, S, dk, values.shape[-1], keys.dtype)
        self.offset = self.offset + S
        self._idx += S
        qk = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for i in range(3):
            self.keys[i][..., prev:self._idx, :] = qk[i]
            self.values[i][..., prev:self._idx, :] = qv[i]
        return self.keys_and_values()

    def _grow(self, B, H, S, dk, dv, dtype) -> None:
        """Room for ``S`` more steps, in slabs of ``step`` (as ``QuantizedKVCache``)."""
        per_int = 32 // self.bits
        shape = (B, H, (self.step + S - 1) // self.step * self.step)

        def init(dim):
            return (mx.zeros((*shape, dim // per_int), dtype=mx.uint32),
                    mx.zeros((*shape, dim // self.group_size), dtype=dtype),
                    mx.zeros((*shape, dim // self.group_size), dtype=dtype))

        def expand(x):
            return mx.concatenate([x, mx.zeros((*shape, x.shape[-1]), dtype=x.dtype)], axis=2)

        if self.keys is None:
            self.keys, self.values = init(dk), init(dv)
            return
        if self._idx % self.step:
            self.keys, self.values = tree_map(lambda x: x[..., :self._idx, :],
                                              (self.keys, self.values))
        self.keys, self.values = tree_map(expand, (self.keys, self.values))

    def keys_and_values(self):
        return tree_map(lambda x: x[..., :self._idx, :], (self.keys, self.values))

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    # -- padding (BatchKVCache's protocol) -----------------------------------------
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None):
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("Left padding can only be added to an empty cache")
            left_padding = mx.array(left_padding)
            self.left_padding += left_padding
            self.offset = self.offset - left_padding
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self):
        if self._right_padding is not None:
            padding = self._right_padding
            self.keys, self.values = tree_map(
                lambda x: dynamic_roll(x, padding[:, None], axis=2), (self.keys, self.values))
            self.offset = self.offset - padding
            self.left_padding += padding
            self._right_padding = None

    # -- rows in and out -----------------------------------------------------------
    def filter(self, batch_indices):
        if self.keys is not None:
            self.keys, self.values = tree_map(lambda x: x[batch_indices],
                                              (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.keys is not None:
                self.keys, self.values = tree_map(lambda x: x[..., shift:, :],
                                                  (self.keys, self.values))
            self._idx -= shift
            self.left_padding -= shift

    def extend(self, other):
        """Append ``other``'s rows (quantizing a plain ``BatchKVCache`` first)."""
        if not isinstance(other, BatchQuantizedKVCache):
            other = BatchQuantizedKVCache.from_plain(other, self.group_size, self.bits)
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        like = self if self.keys is not None else other

        def pad(c):
            rows = c.offset.shape[0]
            parts = (c.keys + c.values if c.keys is not None else
                     tuple(_zeros_like_rows(x, rows, 0) for x in like.keys + like.values))
            left = idx - c._idx
            right = size - parts[0].shape[2] - left
            out = []
            for x in parts:
                if right < 0:
                    x = x[..., :right, :]
                if left or right > 0:
                    x = mx.pad(x, [(0, 0), (0, 0), (left, max(0, right)), (0, 0)])
                out.append(x)
            return out, c.offset, c.left_padding + left

        (a, off_a, lp_a), (b, off_b, lp_b) = pad(self), pad(other)
        parts = [mx.concatenate([x, y]) for x, y in zip(a, b)]
        self.keys, self.values = tuple(parts[:3]), tuple(parts[3:])
        self.offset = mx.concatenate([off_a, off_b])
        self.left_padding = mx.concatenate([lp_a, lp_b])
        self._idx = idx

    def extract(self, idx: int) -> QuantizedKVCache:
        cache = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        mx.eval(self.left_padding)
        padding = cast("list[int]", self.left_padding.tolist())[idx]
        cache.keys, cache.values = tree_map(
            lambda x: mx.contiguous(x[idx:idx + 1, :, padding:self._idx]),
            (self.keys, self.values))
        cache.offset = self._idx - padding
        return cache

    @classmethod
    def merge(cls, caches: list) -> BatchQuantizedKVCache:
        """Rows (``QuantizedKVCache``) right-aligned into one batch, as ``BatchKVCache.merge``."""
        g, b = caches[0].group_size, caches[0].bits
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        if longest == 0:
            return cls([0] * len(caches), g, b)
        padding = [longest - n for n in lengths]
        first = next(c for c in caches if c.keys is not None)
        keys = [_zeros_like_rows(x, len(caches), longest) for x in first.keys]
        values = [_zeros_like_rows(x, len(caches), longest) for x in first.values]
        for i, (p, n, c) in enumerate(zip(padding, lengths, caches)):
            if n == 0:
                continue
            for dst, src in zip(keys + values, c.keys + c.values):
                dst[i:i + 1, :, p:p + n] = src[..., :n, :]
        cache = cls(padding, g, b)
        cache.keys, cache.values = tuple(keys), tuple(values)
        cache.offset += longest
        cache._idx = longest
        return cache

    # -- bookkeeping -----------------------------------------------------------------
    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.left_padding, self._idx = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return tree_reduce(lambda a, x: a + x.nbytes, (self.keys, self.values), 0)
