"""KV-cache quantization schemes: ``off`` (the model's dtype), or uniform affine 4/8 bits.

The uniform scheme is mlx-lm's own ``kv_bits`` scheme: groups of 64 along the head
dimension, a scale and a bias per group in the activation dtype, converted the way
``generate_step(..., kv_bits=b, quantized_kv_start=0)`` converts (after every forward
pass, every plain ``KVCache`` becomes a ``QuantizedKVCache``; the first pass of a fresh
cache therefore attends in full precision). So greedy output equals mlx-lm's token for
token. The server always uses start 0 (mlx-lm's library default of 5000 does not apply): a
request's KV is quantized once its first prompt chunk has run.

What mlx-lm cannot quantize stays in the activation dtype: sliding-window layers
(``RotatingKVCache``), latent/MLA and other composite caches, recurrent state, and
layers whose head dimension is not a multiple of the group (:func:`quantizable`). The
config says which layers those are (:func:`mlxbun_core.library.fit.kv_layout`), so
``/fit``, admission, ``/stats`` and one start-up warning agree.

Single sequences (the serial lane, the batch lane's lone stream) quantize through
:class:`QuantizingModel`, a model wrapper that converts the cache list after every call:
mlx-lm's ``generate_step`` and our solo loop then need no change. Batched rows keep
quantized blocks in the engine's own block pool (``engine/batch/quantized.py``), under
the same rules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("mlxbun.kvquant")

GROUP_SIZE = 64  # mlx-lm's default kv_group_size
CHOICES = ("off", "4", "8")

__all__ = ["KVScheme", "OFF", "GROUP_SIZE", "CHOICES", "parse", "describe", "startup_warning",
           "quantizable", "quantize", "QuantizingModel", "quantizing"]


@dataclass(frozen=True)
class KVScheme:
    """How a server stores KV: ``bits`` None keeps the model's dtype."""

    bits: int | None = None
    group_size: int = GROUP_SIZE

    @property
    def enabled(self) -> bool:
        return self.bits is not None

    @property
    def name(self) -> str:
        """The prefix-cache namespace part: quantized and unquantized KV never mix."""
        return f"kv:affine{self.bits}:g{self.group_size}" if self.bits else "kv:native"

    def mode(self, dtype: str = "bfloat16") -> str:
        """``/stats`` ``kv_quant.mode`` and ``/fit`` ``kv_quant``: the scheme, or for an
        unquantized cache ``dtype``, the activation dtype it holds (float32 on a CPU)."""
        return f"uniform-kv{self.bits}" if self.bits else dtype

    @property
    def flag(self) -> str:
        """The ``--kv-quant`` value that selects this scheme."""
        return str(self.bits) if self.bits else "off"

    def element_bytes(self, dtype_bytes: int) -> float:
        """Bytes per cached K/V element of a quantized layer: the packed bits plus a scale
        and a bias per group in the activation dtype."""
        if not self.bits:
            return float(dtype_bytes)
        return self.bits / 8 + 2 * dtype_bytes / self.group_size


OFF = KVScheme()


def parse(value: Any) -> KVScheme:
    """``off`` / ``4`` / ``8`` (or a scheme, or None for off) → a :class:`KVScheme`."""
    if value is None or isinstance(value, KVScheme):
        return value or OFF
    text = str(value).strip().lower()
    if text in ("off", "none", "bf16", "0", ""):  # "bf16": the older name of off
        return OFF
    if text in ("4", "8"):
        return KVScheme(int(text))
    raise ValueError(f"--kv-quant must be one of {', '.join(CHOICES)} (got {value!r})")


def describe(scheme: KVScheme, layout, dtype: str = "bfloat16") -> dict:
    """``/stats`` ``kv_quant``: the scheme and what each layer holds, from the fit layout
    (a :class:`~mlxbun_core.library.fit.KVLayout` billed under ``scheme``); layers left
    unquantized are counted under their ``dtype``."""
    kinds = layout.layers
    full, sliding = kinds.get("full", 0), kinds.get("sliding", 0)
    quantized = layout.quantized_layers if scheme.bits else 0
    layers = {f"kv{scheme.bits}": quantized} if scheme.bits else {}
    layers[dtype] = full + sliding - quantized
    for kind, label in (("linear", "recurrent"), ("shared", "kv_shared")):
        if kinds.get(kind):
            layers[label] = kinds[kind]
    return {"mode": scheme.mode(dtype), "bits": scheme.bits,
            "group_size": scheme.group_size if scheme.bits else None,
            "quantized_kv_start": 0 if scheme.bits else None,
            "layers": layers, "attention": {"global": full, "sliding_window": sliding}}


def startup_warning(scheme: KVScheme, layout) -> str | None:
    """The one warning for attention layers a quantized scheme leaves unquantized."""
    if not scheme.bits:
        return None
    kinds = layout.layers
    sliding = kinds.get("sliding", 0)
    other = kinds.get("full", 0) - layout.quantized_layers
    if not sliding and not other:
        return None
    why = []
    if sliding:
        why.append(f"{sliding} sliding-window (mlx-lm cannot quantize a rotating cache)")
    if other:
        why.append(f"{other} full-attention (a latent cache, or a head dim that is not a "
                   f"multiple of {scheme.group_size})")
    return (f"--kv-quant {scheme.flag}: {sliding + other} of {kinds.get('full', 0) + sliding} "
            f"attention layers keep their dtype: {'; '.join(why)}")


# ---------------------------------------------------------------- conversion

_seen: set = set()


def _once(key, msg: str, *args) -> None:
    """Log a conversion skip once (the start-up warning already named it, from the config)."""
    if key not in _seen:
        _seen.add(key)
        log.info(msg, *args)


def quantizable(dims: tuple[int, ...], group: int) -> bool:
    """Whether KV with head dimensions ``dims`` (keys, values) divides into groups of
    ``group`` (mlx-lm's ``to_quantized`` would fail on the rest: those keep their dtype)."""
    if any(d % group for d in dims):
        _once(("dims",) + dims, "KV head dims %s are not multiples of the quantization "
              "group %d: those layers keep their dtype", dims, group)
        return False
    return True


def quantize(cache: list, scheme: KVScheme) -> list:
    """Convert, in place, every entry of a single sequence's ``cache`` that the scheme can
    quantize (mlx-lm's ``maybe_quantize_kv_cache`` at start 0, minus what it cannot
    convert); returns it."""
    if not scheme.bits or not cache:
        return cache
    from mlx_lm.models.cache import KVCache

    for i, c in enumerate(cache):  # once converted, a type check per layer and call
        if type(c) is KVCache and c.keys is not None and quantizable(
                (c.keys.shape[-1], c.values.shape[-1]), scheme.group_size):
            cache[i] = c.to_quantized(group_size=scheme.group_size, bits=scheme.bits)
    return cache


class QuantizingModel:
    """A model whose every call quantizes the cache it was given, afterwards.

    Everything else (``layers``, ``make_cache``, ``args`` …) is the wrapped model's,
    so mlx-lm's loops and helpers take it as the model itself.
    """

    def __init__(self, model, scheme: KVScheme):
        self.model, self.scheme = model, scheme

    def __call__(self, inputs, cache=None, input_embeddings=None, **kw):
        if input_embeddings is not None:
            kw["input_embeddings"] = input_embeddings
        out = self.model(inputs, cache=cache, **kw)
        if cache is not None:
            quantize(cache, self.scheme)
        return out

    def __getattr__(self, name):
        return getattr(self.model, name)


def quantizing(model, scheme: KVScheme):
    """``model`` itself when the scheme is off, else a :class:`QuantizingModel`."""
    return QuantizingModel(model, scheme) if scheme.bits else model
