"""Cache objects to (layout, tensors) and back, through mlx-lm's own ``state``.

Every mlx-lm cache class (KVCache, RotatingKVCache, QuantizedKVCache, ArraysCache,
CacheList, ...) exposes ``state`` (arrays and scalars, nested in tuples and lists)
and rebuilds with ``from_state``, so one generic walk stores whatever the RAM
tier holds: a JSON layout names each object's class and replaces every array
with a reference into the tensor list. Nothing here knows a model family.

Plain and quantized KV buffers carry up to 255 positions of spare capacity past
``offset``; they are cut to ``offset`` on the way out (the first decode step
after a restore grows them again, as after a RAM hit's trim).
"""

from __future__ import annotations

import sys
from typing import Any, cast

import mlx.core as mx
import numpy as np


class Unsupported(Exception):
    """A cache this build cannot store (its state holds something unexpected)."""


def _qualified(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve_class(name: str):
    """The cache class ``module:qualname`` names, from modules already imported only
    (a file never makes us import anything), and only a cache class: mlx-lm's or ours."""
    from ..models.classes import cache_classes

    module, _, qual = name.partition(":")
    obj: Any = sys.modules.get(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    ours = isinstance(obj, type) and obj.__module__.startswith("mlxbun") \
        and callable(getattr(obj, "from_state", None))
    if not (ours or (isinstance(obj, type) and issubclass(obj, cache_classes()))):
        raise Unsupported(f"unknown cache class {name}")
    return obj


def _cut(offset: int):
    def cut(a):
        if isinstance(a, mx.array) and a.ndim >= 3 and a.shape[-2] > offset:
            return a[..., :offset, :]
        if isinstance(a, (tuple, list)):
            return type(a)(cut(x) for x in a)
        return a
    return cut


def _compact_state(c) -> Any:
    """``c.state`` with plain/quantized KV cut to ``offset`` (where that is lossless)."""
    from mlx_lm.models.cache import CacheList, KVCache, QuantizedKVCache, RotatingKVCache

    kind = type(c)
    if kind is CacheList:
        return [(_compact_state(inner), type(inner).__name__) for inner in c.caches]
    state = c.state
    offset = getattr(c, "offset", None)
    if not isinstance(offset, int):
        return state
    if kind in (KVCache, QuantizedKVCache) or (
            kind is RotatingKVCache and _unwrapped(state, offset)):
        cut = _cut(offset)
        return (cut(state[0]), cut(state[1]), *state[2:])
    return state


def _unwrapped(state: tuple, offset: int) -> bool:
    """Whether a rotating cache's ``state`` holds its positions in order from 0, nothing
    past ``offset`` (it has not wrapped around its window yet: cutting is lossless)."""
    _, _, _, _, max_size, idx = state  # keys, values, offset, keep, max_size, write index
    return offset < max_size and idx == offset


def encode(cache: list, *, private: bool = False) -> tuple[list, list, list]:
    """``(layout, tensors, mx_dtypes)`` of a cache list, on the MLX owner thread.

    ``tensors`` are evaluated MLX arrays safe to read from another thread through
    numpy (bfloat16 viewed as uint16); ``private`` makes each one a copy that
    shares no buffer with the cache (backends whose host access moves memory).
    """
    tensors: list = []

    def enc(x):
        if isinstance(x, mx.array):
            tensors.append(x)
            return {"$t": len(tensors) - 1}
        if isinstance(x, tuple):
            return {"$tuple": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise Unsupported("a cache state dict with non-string keys")
            return {"$dict": [[k, enc(v)] for k, v in x.items()]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise Unsupported(f"a cache state holds a {type(x).__name__}")

    layout = [{"cls": _qualified(type(c)), "state": enc(_compact_state(c))} for c in cache]
    out, dtypes = [], []
    for t in tensors:
        dtypes.append(str(t.dtype).rsplit(".", 1)[-1])
        if private:
            t = mx.array(t)
        if t.dtype == mx.bfloat16:
            t = t.view(mx.uint16)
        out.append(t)
    mx.eval(out)
    return layout, out, dtypes


def host_view(t: mx.array) -> np.ndarray:
    """A numpy view of an evaluated array (no copy; strided views stay strided)."""
    return np.asarray(t)


def decode(layout: list, arrays: list) -> list:
    """Cache objects from a layout and its tensors (MLX arrays, in order)."""
    def dec(x):
        if isinstance(x, dict):
            if "$t" in x:
                return arrays[x["$t"]]
            if "$tuple" in x:
                return tuple(dec(v) for v in x["$tuple"])
            if "$dict" in x:
                return {k: dec(v) for k, v in x["$dict"]}
            raise Unsupported("unknown layout node")
        if isinstance(x, list):
            return [dec(v) for v in x]
        return x

    from .. import cache_ops

    return [cache_ops.from_state(resolve_class(item["cls"]), dec(item["state"]))
            for item in layout]


def load_arrays(entry, *, strong: bool = False) -> list:
    """The tensors of a checked entry (``fileformat.EntryHeader``), read by MLX's own
    safetensors loader, then every byte hashed against the header (CorruptEntry on any
    difference: nothing loaded may be used)."""
    import hashlib

    import xxhash

    from .fileformat import CorruptEntry

    try:
        loaded = cast("dict[str, mx.array]", mx.load(str(entry.path), format="safetensors"))
        arrays = [loaded[f"t{i}"] for i in range(len(entry.tensors))]
    except (RuntimeError, ValueError, KeyError) as exc:
        if not entry.path.exists():  # removed by another server's byte cap meanwhile
            raise FileNotFoundError(str(entry.path)) from None
        raise CorruptEntry(f"unreadable: {exc}") from None
    for a, spec in zip(arrays, entry.tensors):
        if tuple(a.shape) != spec.shape or str(a.dtype).rsplit(".", 1)[-1] != spec.mx_dtype:
            raise CorruptEntry("a tensor's shape or dtype differs from the header")
    mx.async_eval(arrays)  # MLX reads them in order while the ones read are hashed
    want_strong = entry.header["hash"].get("blake2b") if strong else None
    fast = xxhash.xxh3_128()
    slow = hashlib.blake2b(digest_size=32) if want_strong else None
    for a in arrays:
        if a.nbytes:
            # an mx.array has the buffer protocol; MLX's stubs do not say so
            data = memoryview(a).cast("B")  # type: ignore[arg-type]
            fast.update(data)
            if slow is not None:
                slow.update(data)
    if fast.hexdigest() != entry.header["hash"]["xxh3_128"]:
        raise CorruptEntry("content hash mismatch")
    if slow is not None and slow.hexdigest() != want_strong:
        raise CorruptEntry("blake2b mismatch")
    return arrays


def classes(layout: list) -> list[str]:
    return [item["cls"].rsplit(":", 1)[-1] for item in layout]
