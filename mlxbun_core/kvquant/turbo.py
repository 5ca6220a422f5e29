"""Rotated low-bit KV (``--kv-quant turbo[:kXvY]``, TurboQuant-style).

Before quantizing, each head's key and value vectors are turned by the orthonormal
Hadamard matrix ``H`` (``mx.hadamard_transform`` scaled by ``1/sqrt(dim)``). A few
outlier channels in a key then spread over every channel, so the groups quantize with
a scale set by the vector's overall size rather than by its largest channel, and the
same bits keep more of it. ``H`` is its own inverse, so reading the cache turns the
dequantized vectors back (:func:`restore`) and attention runs over them unchanged, in
the activation dtype: keys at ``key_bits``, values at ``value_bits``, each with a scale
and a bias per group of 64, as mlx-lm's affine scheme stores them.

:class:`TurboKVCache` is the single-sequence cache (the serial lane, the prefix cache's
entries); the batch keeps the same triples in its block pool
(``engine/batch/quantized.py``), so a row crosses between the two unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import create_attention_mask

Triple = tuple[mx.array, mx.array, mx.array]

HEAD_DIMS = "a power of two, or 12, 20 or 28 times one"


def rotatable(dim: int) -> bool:
    """Whether ``mx.hadamard_transform`` takes vectors of ``dim`` (see ``HEAD_DIMS``)."""
    return any(dim % m == 0 and (dim // m) & (dim // m - 1) == 0 for m in (1, 12, 20, 28))


def rotate(x: mx.array) -> mx.array:
    """``x`` turned by the orthonormal Hadamard matrix along its last axis (and back:
    the matrix is its own inverse)."""
    return mx.hadamard_transform(x, scale=1 / math.sqrt(x.shape[-1]))


def encode(x: mx.array, bits: int, group_size: int) -> Triple:
    """Rotate, then quantize (mlx-lm's affine triple)."""
    packed, scales, biases = mx.quantize(rotate(x), group_size=group_size, bits=bits)
    return packed, scales, biases


def restore(t: Triple | list[mx.array], bits: int, group_size: int) -> mx.array:
    """Dequantize a triple and turn it back: what attention reads."""
    packed, scales, biases = t
    return rotate(mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits))


class TurboKVCache:
    """One sequence's rotated low-bit KV; ``update_and_fetch`` answers the whole
    history dequantized and turned back (so mlx-lm's float attention runs over it).
    It has mlx-lm's cache interface (``state``, ``from_state``, ``trim``, ``make_mask``)
    without deriving from mlx-lm's private base class."""

    step = 256

    def __init__(self, key_bits: int = 8, value_bits: int = 3, group_size: int = 64):
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.offset = 0
        self.key_bits, self.value_bits, self.group_size = key_bits, value_bits, group_size

    @classmethod
    def of(cls, keys: mx.array, values: mx.array, offset: int, key_bits: int,
           value_bits: int, group_size: int) -> TurboKVCache:
        """A cache holding the first ``offset`` positions of float ``keys``/``values``
        (a plain ``KVCache``'s after its first pass)."""
        c = cls(key_bits, value_bits, group_size)
        c.update_and_fetch(keys[..., :offset, :], values[..., :offset, :])
        return c

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        prev, n = self.offset, keys.shape[2]
        qk = encode(keys, self.key_bits, self.group_size)
        qv = encode(values, self.value_bits, self.group_size)
        if self.keys is None or self.values is None or prev + n > self.keys[0].shape[2]:
            self.keys, self.values = self._grown(self.keys, qk), self._grown(self.values, qv)
        self.offset += n
        for store, new in ((self.keys, qk), (self.values, qv)):
            for a, b in zip(store, new):
                a[..., prev:self.offset, :] = b
        return self.fetch()

    def _grown(self, old: Triple | None, new: Triple) -> Triple:
        """``old``'s held positions with room for ``new``'s after them (whole steps)."""
        need = self.offset + new[0].shape[2]
        size = (need + self.step - 1) // self.step * self.step
        out = []
        for i, part in enumerate(new):
            room = mx.zeros((*part.shape[:2], size, part.shape[-1]), part.dtype)
            if old is not None and self.offset:
                room[..., :self.offset, :] = old[i][..., :self.offset, :]
            out.append(room)
        return out[0], out[1], out[2]

    def fetch(self) -> tuple[mx.array, mx.array]:
        """The held positions, dequantized and turned back."""
        assert self.keys is not None and self.values is not None
        k = [a[..., :self.offset, :] for a in self.keys]
        v = [a[..., :self.offset, :] for a in self.values]
        return (restore(k, self.key_bits, self.group_size),
                restore(v, self.value_bits, self.group_size))

    @classmethod
    def from_state(cls, state: Any) -> TurboKVCache:
        """A cache holding ``state`` (the SSD tier's and the prefix cache's rebuild)."""
        obj = cls.__new__(cls)
        obj.state = state
        return obj

    @property
    def state(self) -> Any:
        return self.keys, self.values, self.offset, self.group_size, self.key_bits, \
            self.value_bits

    @state.setter
    def state(self, v: Any) -> None:
        keys, values, self.offset, self.group_size, self.key_bits, self.value_bits = v
        self.keys = None if keys is None else (keys[0], keys[1], keys[2])
        self.values = None if values is None else (values[0], values[1], values[2])

    def size(self) -> int:
        return self.offset

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n

    def make_mask(self, n: int, return_array: bool = False,
                  window_size: int | None = None) -> Any:
        return create_attention_mask(n, self.offset, return_array, window_size)

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        parts = [*(self.keys or ()), *(self.values or ())]
        return sum(int(a.nbytes) for a in parts)
