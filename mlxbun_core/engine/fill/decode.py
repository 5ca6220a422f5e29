"""The serial lane's decode loop for a request with a fill session.

mlx-lm's ``generate_step`` feeds exactly one token per forward. This loop is the same
loop (same stream, same processors and sampler, same ``clear_cache`` cadence) except
that each sampled token is fed together with the run the grammar forces after it, in
one forward. A grammar request reads every sampled token on the host anyway (its
matcher needs it), so waiting for the token before building the next forward costs
no pipelining that the plain loop had.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import LogitsProcessor, Sampler
    from .forced import FillSession

Step = tuple[int, "mx.array", list[int]]
"""A sampled token, its log-probabilities, and the forced run fed after it."""


def fill_steps(model: Any, tail: list[int], context: list[int], cache: list[Any],
               sampler: Sampler | None, processors: list[LogitsProcessor],
               fill: FillSession) -> Iterator[Step]:
    """Decode from ``tail`` (the prompt tokens not yet in ``cache``; ``context`` is the
    whole prompt, what the logits processors see): ``(token, logprobs, run)`` per
    sampled token, the run already fed to the model when it is yielded."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    seen = mx.array(context[:len(context) - len(tail)], dtype=mx.uint32)
    pick = sampler or (lambda x: mx.argmax(x, axis=-1))  # mlx-lm's default: greedy

    def forward(ids: list[int]) -> tuple[mx.array, mx.array]:
        nonlocal seen
        step = mx.array(ids, dtype=mx.uint32)
        with mx.stream(generation_stream):
            logits = model(step[None], cache=cache)[:, -1, :]
            if processors:
                seen = mx.concatenate([seen, step])
                for processor in processors:
                    logits = processor(seen, logits)
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return pick(logprobs), logprobs.squeeze(0)

    y, logprobs = forward(tail)
    count = 0
    while True:
        token = cast("int", y.item())  # a token id array: .item() is an int
        run = fill.after(token)
        nxt = forward([token, *run])
        mx.async_eval(*nxt)
        yield token, logprobs, run
        count += 1
        if count % 256 == 0:
            mx.clear_cache()
        y, logprobs = nxt
