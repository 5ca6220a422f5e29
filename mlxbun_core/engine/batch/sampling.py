"""A decode step's per-row logits work: each row's processors over everything it was
fed, then its sampler (a window's own version, over several positions a row, lives in
``windows.py``)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from ...runconfig import current
from .rows import Row


def processed(rows: list[Row], inputs: mx.array, logits: mx.array) -> mx.array:
    """Each row's logits processors over every token it was fed (its context)."""
    if not any(r.processors for r in rows):
        return logits
    out = []
    for i, r in enumerate(rows):
        x = logits[i:i + 1]
        if r.processors:
            r.context = extended(r.context, inputs[i:i + 1])
            for p in r.processors:
                x = p(r.context, x)
        out.append(x)
    return mx.concatenate(out, axis=0)


def extended(context: mx.array | None, tokens: mx.array) -> mx.array:
    """A row's processor context with ``tokens`` fed after it."""
    return tokens if context is None else mx.concatenate([context, tokens])


def sample(logprobs: mx.array, samplers: list[Any]) -> mx.array:
    """Each row's token from its sampler (None: greedy); one call when rows share one."""
    first = samplers[0]
    if all(s is first for s in samplers) and current().engine.batch_vec_sample:
        return mx.argmax(logprobs, axis=-1) if first is None else first(logprobs)
    return mx.concatenate([
        mx.argmax(logprobs[i:i + 1], axis=-1) if s is None else s(logprobs[i:i + 1])
        for i, s in enumerate(samplers)])
