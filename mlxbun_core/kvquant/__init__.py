"""KV-cache quantization schemes: ``off`` (the model's dtype), uniform affine 4/8 bits,
``config`` (per-layer bits from mlx-optiq's kv_config.json: ``config.py``) or ``turbo``
(Hadamard-rotated keys and values at their own bits: ``turbo.py``). A scheme answers per
cache index what that layer keeps (:meth:`KVScheme.layer`); the rest of this page is the
uniform scheme, which the others follow layer by layer.

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
CHOICES = ("off", "4", "8", "config", "turbo[:kXvY]")
TURBO_DEFAULT = (8, 3)  # the reference's turbo default: keys 8 bits, values 3
TURBO_BITS = (2, 3, 4, 5, 6, 8)

__all__ = ["KVScheme", "LayerBits", "OFF", "GROUP_SIZE", "CHOICES", "parse", "describe",
           "startup_warning", "quantizable", "quantize", "QuantizingModel", "quantizing"]


@dataclass(frozen=True)
class LayerBits:
    """How one layer keeps its KV: keys and values at their bits, groups of
    ``group_size``, ``rotate``d first (turbo) or not (mlx-lm's affine scheme)."""

    keys: int
    values: int
    group_size: int = GROUP_SIZE
    rotate: bool = False

    @property
    def label(self) -> str:
        """``/stats`` ``kv_quant.layers`` key."""
        return f"turbo-k{self.keys}v{self.values}" if self.rotate else f"kv{self.keys}"

    def element_bytes(self, dtype_bytes: int) -> float:
        """Bytes per K/V element, keys and values averaged."""
        return (self.keys + self.values) / 16 + 2 * dtype_bytes / self.group_size


@dataclass(frozen=True)
class KVScheme:
    """How a server stores KV: uniform ``bits`` (None: the model's dtype), a per-layer
    ``rules`` table (``config``: (layer, bits, group) from kv_config.json) or ``turbo``
    (key bits, value bits)."""

    bits: int | None = None
    group_size: int = GROUP_SIZE
    rules: tuple[tuple[int, int, int], ...] | None = None
    turbo: tuple[int, int] | None = None
    source: str = ""  # the kv_config.json a config scheme came from

    @property
    def enabled(self) -> bool:
        return bool(self.bits or self.turbo or any(b for _, b, _ in self.rules or ()))

    def layer(self, index: int) -> LayerBits | None:
        """What cache index ``index`` keeps (None: its dtype)."""
        if self.bits:
            return LayerBits(self.bits, self.bits, self.group_size)
        if self.turbo:
            return LayerBits(*self.turbo, self.group_size, rotate=True)
        for i, bits, group in self.rules or ():
            if i == index:
                return LayerBits(bits, bits, group) if bits else None
        return None

    @property
    def bill_bits(self) -> int | None:
        """The bits admission bills every quantizable layer at: an upper bound (a
        config that leaves some layer in its dtype bills the dtype)."""
        if self.turbo:
            return max(self.turbo)
        if self.rules is not None:
            bits = [b for _, b, _ in self.rules]
            return None if not bits or 0 in bits else max(bits)
        return self.bits

    @property
    def name(self) -> str:
        """The prefix-cache namespace part: KV kept one way never meets another's."""
        if self.turbo:
            return f"kv:turbo-k{self.turbo[0]}v{self.turbo[1]}:g{self.group_size}"
        if self.rules is not None:
            return "kv:config:" + ",".join(f"{i}={b}/{g}" for i, b, g in self.rules)
        return f"kv:affine{self.bits}:g{self.group_size}" if self.bits else "kv:native"

    def mode(self, dtype: str = "bfloat16") -> str:
        """``/stats`` ``kv_quant.mode`` and ``/fit`` ``kv_quant``: the scheme, or for an
        unquantized cache ``dtype``, the activation dtype it holds (float32 on a CPU)."""
        if self.turbo:
            return f"turbo k{self.turbo[0]}v{self.turbo[1]}"
        if self.rules is not None:
            return "mixed (kv_config.json)"
        return f"uniform-kv{self.bits}" if self.bits else dtype

    @property
    def flag(self) -> str:
        """The ``--kv-quant`` value that selects this scheme."""
        if self.turbo:
            return f"turbo:k{self.turbo[0]}v{self.turbo[1]}"
        if self.rules is not None:
            return "config"
        return str(self.bits) if self.bits else "off"

    def element_bytes(self, dtype_bytes: int) -> float:
        """Bytes per cached K/V element of a uniformly quantized layer: the packed bits
        plus a scale and a bias per group in the activation dtype."""
        if not self.bits:
            return float(dtype_bytes)
        return self.bits / 8 + 2 * dtype_bytes / self.group_size


OFF = KVScheme()


def _turbo(text: str) -> KVScheme:
    """``turbo`` or ``turbo:k<bits>v<bits>``."""
    import re

    _, _, spec = text.partition(":")
    m = re.fullmatch(r"k(\d+)v(\d+)", spec) if spec else None
    if spec and not m:
        raise ValueError(f"--kv-quant turbo takes :k<bits>v<bits>, e.g. turbo:k8v3 (got {text!r})")
    k, v = (int(m.group(1)), int(m.group(2))) if m else TURBO_DEFAULT
    for what, b in (("key", k), ("value", v)):
        if b not in TURBO_BITS:
            raise ValueError(f"--kv-quant {text}: {what} bits must be one of "
                             f"{', '.join(map(str, TURBO_BITS))}")
    return KVScheme(turbo=(k, v))


def parse(value: Any, model_dir: Any = None) -> KVScheme:
    """``off`` / ``4`` / ``8`` / ``config`` (``config:PATH``) / ``turbo[:kXvY]`` (or a
    scheme, or None for off) → a :class:`KVScheme`; ``config`` reads ``model_dir``'s
    kv_config.json."""
    if value is None or isinstance(value, KVScheme):
        return value or OFF
    text = str(value).strip()
    low = text.lower()
    if low in ("off", "none", "bf16", "0", ""):  # "bf16": the older name of off
        return OFF
    if low in ("4", "8"):
        return KVScheme(int(low))
    if low == "turbo" or low.startswith("turbo:"):
        return _turbo(low)
    if low == "config" or low.startswith("config:"):
        from .config import load

        path, rules = load(text, model_dir)
        return KVScheme(rules=rules, source=str(path))
    raise ValueError(f"--kv-quant must be one of {', '.join(CHOICES)} (got {value!r})")


def describe(scheme: KVScheme, layout, dtype: str = "bfloat16",
             eligible: list[bool] | None = None) -> dict:
    """``/stats`` ``kv_quant``: the scheme and what each layer holds, from the fit layout
    (a :class:`~mlxbun_core.library.fit.KVLayout` billed under ``scheme``); layers left
    unquantized are counted under their ``dtype``. A per-layer scheme (config, turbo)
    counts by cache index over ``eligible`` (which indices are quantizable full
    attention)."""
    kinds = layout.layers
    full, sliding = kinds.get("full", 0), kinds.get("sliding", 0)
    layers: dict[str, int] = {}
    if scheme.bits or eligible is None:
        quantized = layout.quantized_layers if scheme.bits else 0
        if scheme.bits:
            layers[f"kv{scheme.bits}"] = quantized
    else:
        for i, ok in enumerate(eligible):
            spec = scheme.layer(i) if ok else None
            if spec is not None:
                layers[spec.label] = layers.get(spec.label, 0) + 1
        quantized = sum(layers.values())
    layers[dtype] = full + sliding - quantized
    for kind, label in (("linear", "recurrent"), ("shared", "kv_shared")):
        if kinds.get(kind):
            layers[label] = kinds[kind]
    out = {"mode": scheme.mode(dtype), "bits": scheme.bits,
           "group_size": scheme.group_size if scheme.enabled else None,
           "quantized_kv_start": 0 if scheme.enabled else None,
           "layers": layers, "attention": {"global": full, "sliding_window": sliding}}
    if scheme.turbo:
        out["turbo"] = {"key_bits": scheme.turbo[0], "value_bits": scheme.turbo[1],
                        "rotation": "hadamard"}
    if scheme.source:
        out["config"] = scheme.source
    return out


def startup_warning(scheme: KVScheme, layout) -> str | None:
    """The one warning for attention layers a quantized scheme leaves unquantized."""
    if not scheme.bits and not scheme.turbo:
        return None  # (a config names its float layers itself)
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
    convert; per layer under a config; rotated under turbo); returns it."""
    if not scheme.enabled or not cache:
        return cache
    from mlx_lm.models.cache import KVCache

    for i, c in enumerate(cache):  # once converted, a type check per layer and call
        if type(c) is not KVCache or c.keys is None or (spec := scheme.layer(i)) is None:
            continue
        dims = (c.keys.shape[-1], c.values.shape[-1])
        if not quantizable(dims, spec.group_size) or (spec.rotate and not rotatable_dims(dims)):
            continue
        if spec.rotate:
            from .turbo import TurboKVCache

            cache[i] = TurboKVCache.of(c.keys, c.values, c.offset, spec.keys, spec.values,
                                       spec.group_size)
        else:
            cache[i] = c.to_quantized(group_size=spec.group_size, bits=spec.keys)
    return cache


def rotatable_dims(dims: tuple[int, ...]) -> bool:
    """Whether every head dim in ``dims`` takes the Hadamard rotation (logged once if
    not: those layers keep their dtype)."""
    from .turbo import HEAD_DIMS, rotatable

    if all(rotatable(d) for d in dims):
        return True
    _once(("rot",) + dims, "KV head dims %s cannot take the Hadamard rotation (%s): "
          "those layers keep their dtype", dims, HEAD_DIMS)
    return False


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
    return QuantizingModel(model, scheme) if scheme.enabled else model
