"""A lone MTP request on the batch lane, decoded outside the batch (``solo.py``) with the
serial lane's loop (``speculate/mtp.py``: pipelined rounds on single-row caches), until
company arrives.

Its prompt is read through the head (``MtpStream.read``). Joining the batch, the round
in flight is read and settled without queueing another (``MtpStream.handoff``): its
tokens are delivered, the cache holds exactly the tokens fed, the last token is the
row's next input and the head goes with the row (:meth:`MtpSolo.head_state`: its cache,
the states it has not read, and the kept tokens a recurrent rollback took out, which
the row feeds again first). A batch that drains to one MTP row hands it back out here
(``resume_mtp``) with the same state, the pending token handed out with the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..speculate import HeadState, MtpStream
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
        self._head: HeadState | None = None  # set by a hand-off mid-reply
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
                   predictor: TokenPredictor, head: HeadState) -> MtpSolo:
        """A batch's last MTP row going on alone: ``cache`` holds ``fed``; ``pending`` the
        ``(token array, logprobs)`` sampled and not fed; ``head`` its head
        (``MtpBatch.leaving``)."""
        import mlx.core as mx

        solo = cls(model, job, cache, 0, pacer, predictor)
        solo.fed[:] = fed
        y, logprobs = pending
        mx.eval(y, logprobs)
        token = cast(int, y.reshape(-1)[0].item())  # a token id
        solo.mtp.resume(token, (token, logprobs), head)
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
        out, token, self._head = self.mtp.handoff()
        return out, [[token]]

    def head_state(self) -> HeadState:
        """The head going into the batch with the job (after :meth:`handoff`)."""
        return self._head or HeadState(self.mtp.head_cache)
