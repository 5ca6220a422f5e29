"""Check, at start-up, that this backend can attend over a quantized cache for this model.

MLX's CUDA backend (0.32) has no ``quantized_matmul`` for some of the shapes mlx-lm's
quantized attention produces: on an H200 the grouped-query decode step of an 8B model
after a 4,096-token prompt failed with ``No implementation for problem shape:
1x4097x128x32``. Found at the first request, that is a 500 in the middle of a reply; found
here, it is one clear start-up error. The probe runs mlx-lm's own quantized attention with
the model's head counts at a few query and key lengths (decode and a prefill chunk, key
lengths on and off the alignment boundaries, as strided views of a grown buffer the way
mlx-lm's cache hands them over: contiguous keys of the same shape ran), so it also pays the
first-use kernel build while nobody waits. On the H200 it stops the start 19 s after the
load began, with the shape (``1x65x128x32``) in the message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mlxbun.kvquant")

QUERY_LENGTHS = (1, 8)
KEY_LENGTHS = (65, 4097)

Attention = Callable[..., Any]


class KVQuantUnavailable(RuntimeError):
    """The backend cannot run quantized attention for this model's shape."""


def attention_shape(config: dict[str, Any]) -> tuple[int, int, int] | None:
    """(query heads, KV heads, head dim) of the full-attention layers, or None when the
    config does not say (a latent cache or an architecture we do not read)."""
    t = config.get("text_config") or config
    heads = t.get("num_attention_heads")
    hidden = t.get("hidden_size")
    if not heads or (not t.get("head_dim") and not hidden):
        return None
    kv_heads = t.get("num_key_value_heads") or heads
    head_dim = t.get("head_dim") or hidden // heads
    return int(heads), int(kv_heads), int(head_dim)


def check_kernels(bits: int, group_size: int, config: dict[str, Any], dtype: Any = None,
                  attention: Attention | None = None) -> None:
    """Run quantized attention at the probe's lengths; raise :class:`KVQuantUnavailable`
    naming the failing shape. Skipped where the head dim does not divide into groups
    (those layers keep their dtype anyway)."""
    import mlx.core as mx

    if attention is None:
        from mlx_lm.models.base import quantized_scaled_dot_product_attention

        attention = quantized_scaled_dot_product_attention
    shape = attention_shape(config)
    if shape is None or shape[2] % group_size:
        return
    heads, kv_heads, dim = shape
    dtype = dtype or mx.bfloat16
    for keys in KEY_LENGTHS:
        # as mlx-lm's quantized cache hands them over: views of a buffer grown in steps of
        # 256, not contiguous arrays (the strided case is the one a kernel may lack)
        room = -(-keys // 256) * 256
        k = mx.random.normal((1, kv_heads, room, dim)).astype(dtype)
        w, scales, biases = mx.quantize(k, group_size=group_size, bits=bits)
        qk = (w[..., :keys, :], scales[..., :keys, :], biases[..., :keys, :])
        for queries in QUERY_LENGTHS:
            q = mx.random.normal((1, heads, queries, dim)).astype(dtype)
            mask = (mx.arange(keys - queries, keys)[:, None] >= mx.arange(keys)[None]
                    if queries > 1 else None)
            try:
                mx.eval(attention(q, qk, qk, scale=dim ** -0.5, mask=mask,
                                  group_size=group_size, bits=bits))
            except (RuntimeError, ValueError) as exc:
                why = str(exc).rstrip(".")
                raise KVQuantUnavailable(
                    f"--kv-quant {bits}: this MLX build ({_mlx_version()}, "
                    f"{'CUDA' if _cuda() else 'this backend'}) cannot attend over a quantized "
                    f"cache for this model ({heads} query heads, {kv_heads} KV heads, head dim "
                    f"{dim}; {queries} queries over {keys} keys): {why}. Serve without "
                    "--kv-quant, or with another MLX version.") from None
    log.debug("quantized attention checked for %d/%d heads × %d", heads, kv_heads, dim)


def model_dtype(model: Any) -> Any:
    """The activation dtype: that of the first floating-point parameter (quantized weights
    are integers; their scales carry the dtype)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    for item in tree_flatten(model.parameters()):
        p = item[1]
        if isinstance(p, mx.array) and mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.bfloat16


def _cuda() -> bool:
    import mlx.core as mx

    try:
        return bool(mx.cuda.is_available())
    except AttributeError:
        return False


def _mlx_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("mlx", "mlx-cuda-13", "mlx-cuda", "mlx-metal"):
        try:
            return f"mlx {version(dist)}"
        except PackageNotFoundError:
            continue
    return "mlx"
