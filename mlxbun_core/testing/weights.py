"""Random weights for tiny test checkpoints, the same for the same seed whatever the model.

Each matrix is drawn from its own key (the seed and the parameter's name), so adding a
layer or a tower never changes the weights of the others; the language model
(:mod:`.checkpoints`) and the media towers (:mod:`.vision`) draw theirs here.
"""

from __future__ import annotations

import zlib
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def random_params(model: nn.Module, seed: int, dtype: mx.Dtype) -> dict[str, mx.array]:
    """Matrices ~ N(0, 1/fan_in) keyed by (seed, name): independent of init order."""
    keep_f32 = getattr(model, "cast_predicate", None)
    out = {}
    leaves = cast("list[tuple[str, mx.array]]", tree_flatten(model.parameters()))
    for name, p in sorted(leaves, key=lambda leaf: leaf[0]):
        if p.ndim >= 2:
            key = mx.random.key(zlib.crc32(f"{seed}:{name}".encode()))
            fan_in = p.shape[1] if "conv1d" in name else p.shape[-1]
            p = mx.random.normal(p.shape, key=key) * (fan_in**-0.5)
        if mx.issubdtype(p.dtype, mx.floating):
            p = p.astype(mx.float32 if keep_f32 and not keep_f32(name) else dtype)
        out[name] = p
    mx.eval(out)
    return out
