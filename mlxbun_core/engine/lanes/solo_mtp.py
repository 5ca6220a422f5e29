"""A lone MTP request on the batch lane, decoded outside the batch (``solo.py``) with the
serial lane's loop (``speculate/mtp.py``: pipelined rounds on single-row caches), until
company arrives.

Its prompt is read through the head (``MtpStream.read``). Joining the batch, the round
in flight is read and settled without queueing another (``MtpStream.handoff``): its
tokens are delivered, the cache holds exactly the tokens fed, and the tokens it still
lacks (kept tokens a recurrent rollback took out, then the last one) are the row's
segments; the head's cache goes with the row. A batch that drains to one MTP row hands
it back out here (``resume_mtp``): the pending token (handed out with the next step), the
row's head cache taken out of the batched one, its pending states and its refeed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..speculate import MtpStream
from .solo import Solo, Step, _steps

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

    from ...contract import TokenPredictor
    from ..job import GenerationJob
    from .pace import PrefillPacer


class MtpSolo(Solo):
    """One lone MTP job: ``mtp`` is its stream (its head cache rides along)."""

    def __init__(self, model: nn.Module, job: GenerationJob, cache: list[Any], cached: int,
                 pacer: PrefillPacer, predictor: TokenPredictor):
        super().__init__(model, job, cache, cached, pacer)
        self._spec_ok = False  # (not prompt lookup)
        req, usage = job.request, job.session.usage
        assert job.spec is not None and req.sampler is not None  # an MTP job, prepared
        if usage.speculation is None:
            usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
            if job.spec_tally is not None:
                job.spec_tally.requests += 1
        self.mtp = MtpStream(predictor, cache, self.fed,
                             job.spec.num_draft_tokens or predictor.num_draft_tokens,
                             req.sampler, req.processors, usage.speculation, job.spec_tally)

    @classmethod
    def resume_mtp(cls, model: nn.Module, job: GenerationJob, cache: list[Any],
                   fed: list[int], pending: tuple[mx.array, mx.array], pacer: PrefillPacer,
                   predictor: TokenPredictor,
                   state: tuple[list[Any], mx.array | None, list[int], list[int]]) -> MtpSolo:
        """A batch's last MTP row going on alone: ``cache`` holds ``fed``; ``pending`` the
        ``(token array, logprobs)`` sampled and not fed; ``state`` its MTP state
        (``MtpBatch.leaving``)."""
        import mlx.core as mx

        solo = cls(model, job, cache, 0, pacer, predictor)
        solo.fed[:] = fed
        head, hidden, after, refeed = state
        solo.mtp.head_cache = head
        y, logprobs = pending
        mx.eval(y, logprobs)
        token = cast(int, y.reshape(-1)[0].item())  # a token id
        solo.mtp.resume(token, (token, logprobs), hidden, after, refeed)
        return solo

    def step(self) -> list[Step] | None:
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        with mx.stream(generation_stream):
            if self.prefilling:
                start, size = len(self.fed), self.pacer.chunk()
                end = min(start + size, len(self.prompt) - 1)
                with self.pacer.timed(size) as timer:
                    self.mtp.read(self.prompt[start:end], self.prompt[end])
                    timer.tokens = end - start
                return None
            if not self.mtp.running:
                self.mtp.begin(self.prompt[-1])
            return _steps(self.mtp.step())

    def settle(self) -> None:
        """Stop: the round in flight is read and dropped (the cache then holds ``fed``,
        recurrent layers included)."""
        if self.mtp.running:
            self.mtp.handoff()

    def handoff(self) -> tuple[list[tuple[int, mx.array]], list[list[int]]]:
        if not self.mtp.running:
            return super().handoff()  # still reading the prompt
        out, feed = self.mtp.handoff()
        return out, [feed]

    def head_cache(self) -> list[Any]:
        return self.mtp.head_cache
