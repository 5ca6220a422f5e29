"""Lane phases for ``MLXBUN_P2R_TRACE`` records (``server/trace.py``): a session keeps
``(phase, start, end, attributes)`` spans on the ``perf_counter`` clock only while
tracing is on, and token zero (the first sampled token) is split into its stages.

Token zero's stages are timed by evaluating between them (``Laps``), which MLX otherwise
runs as one lazy graph: ``token_zero.forward`` (the model's pass over the prompt's last
token, up to the logits), ``token_zero.head`` (logits processors and the log-softmax) and
``token_zero.sample`` (the sampler). The evaluation changes no value, only when the work
runs, and only for that one token of a traced request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..runconfig import current

if TYPE_CHECKING:
    import mlx.core as mx

    from ..contract import LogitsProcessor, Sampler

Span = tuple[str, float, float, dict[str, Any]]
TOKEN_ZERO = ("token_zero.forward", "token_zero.head", "token_zero.sample")


def tracing() -> bool:
    """Whether requests are traced now (``MLXBUN_P2R_TRACE=1``)."""
    return bool(current().server.p2r_trace)


class Laps:
    """Token zero's stage boundaries: each ``lap`` evaluates what it is given and notes
    when it was done; ``times[0]`` is when the forward began."""

    def __init__(self, start: float | None = None) -> None:
        self.times = [time.perf_counter() if start is None else start]

    def lap(self, *arrays: mx.array) -> None:
        import mlx.core as mx

        mx.eval(*arrays)
        self.times.append(time.perf_counter())

    def spans(self, **attributes: Any) -> list[Span]:
        """The three stages, once all three laps ran (else none)."""
        if len(self.times) < 4:
            return []
        t = self.times
        return [(phase, t[i], t[i + 1], dict(attributes)) for i, phase in enumerate(TOKEN_ZERO)]


def probed(sampler: Sampler, processors: Sequence[LogitsProcessor],
           done: Callable[[list[Span]], None]) -> tuple[Sampler, list[LogitsProcessor]]:
    """``sampler`` and ``processors`` for a decode loop we do not own (mlx-lm's
    ``generate_step``) that time its first step's stages: a first processor evaluates the
    logits (the forward's end), the sampler evaluates its input (the head's end) and its
    token (the sample's end); ``done`` gets the spans once. Later steps pass through."""
    laps = Laps()

    def forward_end(tokens: mx.array, logits: mx.array) -> mx.array:
        if len(laps.times) == 1:
            laps.lap(logits)
        return logits

    def sample(logprobs: mx.array) -> mx.array:
        if len(laps.times) != 2:
            return sampler(logprobs)
        laps.lap(logprobs)
        token = sampler(logprobs)
        laps.lap(token)
        done(laps.spans())
        return token

    return sample, [forward_end, *processors]
