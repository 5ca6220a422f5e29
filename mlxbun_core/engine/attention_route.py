"""Short multi-token attention without cuDNN on CUDA.

MLX's CUDA backend runs attention for a query of more than one token through cuDNN, and
cuDNN builds an execution graph for every new (query length, key length, strides) it
sees: 51-77 ms on an H200, against under 2 ms for the attention itself. Long prefills amortise
that, but the short forwards a server runs all day never meet the same shape twice,
because the key length grows with every one of them:

- the few new tokens of a second chat turn over a cached history;
- a speculation verify (a draft window of 2-16 tokens at a new offset every round);
- a forced-token fill run (a schema's fixed key, a tool call's markup).

Each paid a fresh graph build, which is why those paths measured slower on the H200 than
on paper. Here such a query (``MAX_QUERY`` tokens or fewer, scores under
``MAX_SCORES`` elements) is computed as plain ops instead: the scores matmul, a float32
softmax and the values matmul, the same arithmetic MLX's own fallback does, with no
per-shape graph. Single-token decode and long prefills keep MLX's fused kernels.

``MLXBUN_SHORT_ATTENTION``: ``auto`` (the default: on with CUDA for bfloat16 attention, off
elsewhere; Metal and the CPU build nothing per shape), ``on`` (every dtype), ``off``.
``auto`` leaves float16 alone: with one float16 model (SmolLM2-135M converted to 4-bit)
the route made short forwards 6x faster on the H200, but 4 of 16 runs hung inside
MLX's evaluation (at different ops, only with the route on), for a cause not found yet;
every bfloat16 run measured was fine. Installing wraps
``mx.fast.scaled_dot_product_attention`` once per process, which every mlx-lm model
reaches through ``mlx_lm.models.base``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from ..env_readers import parse_switch
from ..runconfig import current

log = logging.getLogger("mlxbun.engine")

MODES = ("auto", "on", "off")
MAX_QUERY = 256  # query tokens: a turn's tail, a draft window, a fill run
MAX_SCORES = 1 << 28  # batch x heads x query x keys; above it the fused kernel's memory wins

_fused: Callable[..., mx.array] | None = None  # MLX's own function, once wrapped
_dtypes: frozenset[Any] | None = None  # the query dtypes routed (None: all)


def parse_mode(value: str | None) -> str:
    return parse_switch(value, "MLXBUN_SHORT_ATTENTION")


def wanted(mode: str | None = None) -> bool:
    """Whether the short path should be installed in this process."""
    mode = parse_mode(mode) if mode is not None else current().engine.short_attention
    if mode != "auto":
        return mode == "on"
    try:
        return bool(mx.cuda.is_available())
    except AttributeError:
        return False


def dtypes_for(mode: str) -> frozenset[Any] | None:
    """The query dtypes a mode routes (``None``: every dtype)."""
    return None if parse_mode(mode) == "on" else frozenset({mx.bfloat16})


def install(mode: str | None = None) -> bool:
    """Route short queries to :func:`attention` for the rest of the process (idempotent);
    ``mode`` defaults to the run configuration's (``MLXBUN_SHORT_ATTENTION``). Returns
    whether it is installed."""
    global _fused, _dtypes
    if _fused is not None:
        return True
    mode = parse_mode(mode) if mode is not None else current().engine.short_attention
    if not wanted(mode):
        return False
    _dtypes = dtypes_for(mode)
    _fused = mx.fast.scaled_dot_product_attention
    mx.fast.scaled_dot_product_attention = _route
    log.info("attention: %squeries of 2-%d tokens run without cuDNN (no graph per shape)",
             "" if _dtypes is None else "bfloat16 ", MAX_QUERY)
    return True


def uninstall() -> None:
    """Put MLX's function back (tests, benches)."""
    global _fused
    if _fused is not None:
        mx.fast.scaled_dot_product_attention = _fused
        _fused = None


def short(q: mx.array, k: mx.array) -> bool:
    """Whether this call takes the plain-ops path."""
    b, h, n, _ = q.shape
    return (1 < n <= MAX_QUERY and b * h * n * k.shape[2] <= MAX_SCORES
            and (_dtypes is None or q.dtype in _dtypes))


def _route(q: mx.array, k: mx.array, v: mx.array, *, scale: float,
           mask: Any = None, sinks: mx.array | None = None, **kw: Any) -> mx.array:
    assert _fused is not None
    if sinks is None and not kw and short(q, k):
        return attention(q, k, v, scale=scale, mask=mask)
    return _fused(q, k, v, scale=scale, mask=mask, sinks=sinks, **kw)


def attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float,
              mask: Any = None) -> mx.array:
    """softmax(q k^T * scale + mask) v for grouped-query heads, with ``mask`` as MLX's
    fused function takes it: ``None``, ``"causal"`` (aligned to the last key), a boolean
    array (True keeps) or an additive one, broadcastable to (B, heads, query, keys).

    The query heads that share a KV head are stacked along the query axis, so both
    products are plain batched matmuls over the KV heads (no broadcast copy of the keys)."""
    b, hq, n, d = q.shape
    hk, s = k.shape[1], k.shape[2]
    g = hq // hk
    scores = (q * scale).reshape(b, hk, g * n, d) @ k.swapaxes(-1, -2)  # (b, hk, g*n, s)
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        keep = mx.arange(s - n, s)[:, None] >= mx.arange(s)[None]  # (n, s), last key aligned
        scores = mx.where(keep, scores.reshape(b, hk, g, n, s), mx.finfo(scores.dtype).min)
        scores = scores.reshape(b, hk, g * n, s)
    elif mask is not None:
        scores = _masked(scores, mask, b, hq, hk, g, n)
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ v).reshape(b, hq, n, v.shape[-1])  # value heads may be narrower


def _masked(scores: mx.array, mask: mx.array, b: int, hq: int, hk: int, g: int,
            n: int) -> mx.array:
    """``scores`` (b, hk, g*n, s) with an array ``mask`` given per query head, or shared."""
    while mask.ndim < 4:
        mask = mx.expand_dims(mask, 0)
    if mask.shape[2] != n:  # one row for every query
        mask = mx.broadcast_to(mask, (*mask.shape[:2], n, mask.shape[3]))
    if mask.shape[1] == hq and hq > 1:  # one mask per query head: stack like the queries
        mask = mask.reshape(mask.shape[0], hk, g * n, mask.shape[-1])
    elif g > 1:  # shared by the heads: repeat it for each stacked head
        mask = mx.tile(mask, (1, 1, g, 1))
    if mask.dtype == mx.bool_:
        return mx.where(mask, scores, mx.finfo(scores.dtype).min)
    return scores + mask.astype(scores.dtype)
