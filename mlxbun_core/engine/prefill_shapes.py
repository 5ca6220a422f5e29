"""Prefill query lengths from a small known set, on backends where a new length costs.

On CUDA the first forward pass at a query length the process has not run yet costs
50-77 ms on an H200 at the 8B shape (kernel selection and compilation; 11-15 ms the
next time), so every second turn, whose few new tokens after a prefix-cache hit are a
length never seen, paid that floor. The pacer already sizes full chunks as powers of
two; what remains arbitrary is a prompt's tail. With buckets on, every prefill chunk is
split into power-of-two pieces (37 tokens: 32 + 4 + 1), so only ``log2(max chunk) + 1``
lengths ever run, and :func:`warm` runs each once at start-up.

Splitting needs no padding and no mask: each piece is an ordinary prefill chunk, the KV
ends up holding the same tokens. The numerics trade-off: a different chunking rounds
differently (a longer query is a different GEMM), so logits can move by float rounding
against the unsplit chunk, which can flip near-tie greedy tokens. That is why it is off
where new lengths are cheap (CPU, Metal): there ``--batch 1`` stays bit-exact with
mlx-lm's own chunking. ``MLXBUN_PREFILL_BUCKETS`` (``serve --prefill-buckets``):
``auto`` (the default), ``on``, ``off``.

``auto`` is off on every backend: measured on an H200 (8B, a second turn over a 4,046-token
cached history), buckets made the second turn slower, 223 ms median against 122 ms without.
The reason came later (``bench/cuda_attention.py``): most of that first-use cost is cuDNN
building an attention graph per (query length, key length), and the key length changes with
every turn, so fixed query lengths cannot make it repeat. :mod:`.attention_route` removes
the cost instead. ``on`` stays for measuring.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..env_readers import parse_switch
from ..runconfig import current

if TYPE_CHECKING:
    import mlx.core as mx

log = logging.getLogger("mlxbun.engine")

MODES = ("auto", "on", "off")


def parse_mode(value: str | None) -> str:
    return parse_switch(value, "MLXBUN_PREFILL_BUCKETS")


def enabled() -> bool:
    """Whether prefill chunks are split into power-of-two pieces (the run configuration,
    read per call, so tests can switch it with ``runconfig.overridden``)."""
    mode = current().engine.prefill_buckets
    return mode == "on"  # auto: off everywhere (see the module's note)


def pieces(n: int) -> list[int]:
    """``n`` tokens as the lengths to run: ``[n]`` with buckets off, else its
    power-of-two parts, largest first."""
    if n <= 1 or not enabled():
        return [n]
    return [1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1]


def prefill(model: Any, tokens: list[int], cache: list[Any],
            embeddings: mx.array | None = None) -> None:
    """Run ``tokens`` (or their ``embeddings``, shape (n, d)) through ``model`` into
    ``cache`` as one chunk, split into bucket lengths when buckets are on; evaluated."""
    import mlx.core as mx

    n = len(tokens) if embeddings is None else embeddings.shape[0]
    start = 0
    for size in pieces(n):
        stop = start + size
        if embeddings is None:
            model(mx.array(tokens[start:stop])[None], cache=cache)
        else:  # the prompt may be empty: the embeddings are the input
            model(mx.array(tokens[start:stop] if tokens else [])[None], cache=cache,
                  input_embeddings=embeddings[start:stop][None])
        mx.eval([c.state for c in cache])
        start = stop


def warm(model: Any, longest: int) -> int:
    """With buckets on, one forward at every bucket length up to ``longest`` on a
    scratch cache (start-up, worker thread), so the first real request at each length
    does not pay for it; the lengths run (0 with buckets off or on failure)."""
    if not enabled():
        return 0
    import mlx.core as mx

    from .. import cache_ops

    sizes = [1 << b for b in range(max(1, longest).bit_length())]
    try:
        for size in sizes:
            cache = cache_ops.make(model)
            model(mx.zeros((1, size), dtype=mx.int32), cache=cache)
            mx.eval([c.state for c in cache])
    except Exception as exc:  # not a causal LM we can call plainly
        log.debug("prefill bucket warm-up skipped: %s", exc)
        return 0
    return len(sizes)
