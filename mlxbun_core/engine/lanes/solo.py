"""A lone request, decoded outside the batch until another one can join it.

mlx-lm's ``BatchGenerator`` costs a lone stream against mlx-lm's single-sequence
loop (batch caches, masks, per-row bookkeeping: 0.72-0.81x on an H200 at the 8B
shape), and a local server mostly serves one client at a time. So the batch lane
runs a lone job here, one prefill chunk (sized by the engine's pacer) or one token
per ``step``, with the same pipelined step as mlx-lm's ``generate_step`` (the next
token is queued before the current one is read), and moves it into the batch the
moment another job can join: ``handoff`` gives the token still to feed, and ``fed`` / ``cache`` say
what the KV holds. A batch that drains to one decoding row hands it back here
(``resume``). :class:`SoloSlot` is the batch lane's side of all this: the lone job's
start, steps and both hand-offs (in :mod:`.slot`), so the lane keeps only its queue and rows.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from ... import cache_ops
from .. import prefill_shapes
from ..batch.lean import LeanDecode, plain_caches
from ..job import GenerationJob
from ..prompt_cache import trimmable
from ..speculate import SpecStream, rewindable
from .pace import PrefillPacer
from .spec_stream import spec_stream

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

    from ..stages import Laps


log = logging.getLogger("mlxbun.engine")

Pending: TypeAlias = "tuple[mx.array, mx.array]"
"""A token sampled but not yet fed, as the device holds it: (token array, log-probs)."""
Step: TypeAlias = "tuple[int, mx.array, list[int]]"
"""One token a step delivers: the token, its log-probs, the fill-forced run fed after it."""


class Solo:
    """One lone job's decode: its KV ``cache``, the tokens ``fed`` into it, and the
    token sampled but not yet fed."""

    def __init__(self, model: nn.Module, job: GenerationJob, cache: list[Any], cached: int,
                 pacer: PrefillPacer, *, pending: Pending | None = None,
                 lean: LeanDecode | None = None) -> None:
        self.model, self.job, self.cache = model, job, cache
        self.lean = lean  # the model's lean one-token step (batch/lean.py's for_solo), or None
        self.prompt = job.request.prompt_tokens
        self.fed = list(self.prompt[:cached])  # tokens whose forward pass was issued, in order
        self.pacer = pacer  # prompt tokens per prefill chunk
        self._next = pending  # (token, logprobs) being computed: sampled, not fed
        self._context: mx.array | None = None  # what the logits processors see: all fed tokens
        self._count = 0
        self.spec: SpecStream | None = None  # prompt-lookup speculation (job.spec), once begun
        # (a request that fills too fills its forced runs and drafts the rest: guided.py)
        self._spec_ok = job.spec is not None

    @classmethod
    def resume(cls, model: nn.Module, job: GenerationJob, cache: list[Any], fed: list[int],
               pending: Pending, pacer: PrefillPacer, lean: LeanDecode | None = None) -> Solo:
        """A job leaving the batch: ``cache`` holds ``fed``; ``pending`` is the
        ``(token array, logprobs)`` sampled from it and not yet fed."""
        solo = cls(model, job, cache, 0, pacer, pending=pending, lean=lean)
        solo.fed = list(fed)
        return solo

    @property
    def prefilling(self) -> bool:
        return self._next is None and len(self.fed) < len(self.prompt) - 1

    def boundary(self) -> list[Any] | None:
        """A copy of the KV at the prompt boundary when the cache cannot rewind (to be
        published for the next turn); None when it can."""
        return None if trimmable(self.cache) else cache_ops.copy(self.cache)

    def step(self) -> list[Step] | None:
        """One prefill chunk (returns None) or the tokens of one step, each ``(token,
        logprobs, run)``: several when a speculative window was accepted, ``run`` being
        the fill-forced tokens fed after a token (usually none)."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        with mx.stream(generation_stream):
            if self.spec is not None and self.spec.running:
                return _steps(self.spec.step())
            if self._spec_ok and not self.prefilling and self._spec_begin():
                assert self.spec is not None  # begun just now
                return _steps(self.spec.step())
            if self._next is None:
                if self.prefilling:
                    start, size = len(self.fed), self.pacer.chunk()
                    chunk = self.prompt[start:min(start + size, len(self.prompt) - 1)]
                    self._first(prefill_shapes.pieces(len(chunk))[0])  # (its first piece)
                    t0 = time.perf_counter()
                    with self.pacer.timed(size) as timer:  # (bucketed lengths on CUDA)
                        prefill_shapes.prefill(self.model, chunk, self.cache)
                        timer.tokens = len(chunk)
                    self.job.session.span("prefill.chunk", t0, tokens=len(chunk))
                    self.fed += chunk
                    return None
                self._first(1)
                laps = None
                if self.job.session.spans is not None:  # traced: token zero's stages
                    from ..stages import Laps

                    laps = Laps()
                self._next = self._forward(mx.array(self.prompt[-1:]), laps)
                if laps is not None:
                    self.job.session.spanned(laps.spans())
                self.fed.append(self.prompt[-1])
                mx.async_eval(*self._next)
            y, logprobs = self._next
            run: list[int] = []
            if self.job.fill is not None:  # the grammar's forced run rides with y
                token = cast(int, y.item())  # a token id
                run = self.job.fill.after(token)
                self._next = self._forward(mx.array([token, *run]))
                mx.async_eval(*self._next)
            else:
                self._next = self._forward(y)  # queued before we wait on y: never idle
                mx.async_eval(*self._next)
                token = cast(int, y.item())
        self.fed += [token, *run]
        self._count += 1
        if self._count % 256 == 0:
            mx.clear_cache()
        return [(token, logprobs, run)]

    def _first(self, n: int) -> None:
        """A pass of ``n`` tokens is about to run: the job's first over no KV when
        nothing was fed yet (a row recomputed under a KV scheme reads as many first:
        ``Row.first_kept``)."""
        if not self.fed and not self.job.first_pass:
            self.job.first_pass = n

    def _spec_begin(self) -> bool:
        """Start the job's prompt-lookup stream where the cache can rewind."""
        self._spec_ok = False
        spec = self.job.spec
        if spec is None or not rewindable(self.cache, 2):
            return False
        usage = self.job.session.usage
        if usage.speculation is None:
            usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
            if self.job.spec_tally is not None:
                self.job.spec_tally.requests += 1
        self.spec = spec_stream(self.job, self.model, self.cache, self.fed)
        if self._next is None:  # the prompt's last token starts it
            self._first(1)
            self.spec.begin(self.prompt[-1])
        else:  # a row back from the batch: its pending token starts it
            y, logprobs = self._next
            self._next = None
            token = cast(int, y.item())  # a token id
            self.spec.begin(token, (token, logprobs))
        return True

    def settle(self) -> None:
        """Drop speculative drafts still in flight (the cache then holds ``fed``)."""
        if self.spec is not None and self.spec.running:
            self._next = self.spec.settle()

    def handoff(self) -> tuple[list[tuple[int, mx.array]], list[list[int]]]:
        """``(tokens, segments)`` for the batch: the ``(token, logprobs)`` computed but
        not yet handed out (the sampled, unfed one; none while the prompt is still being
        read) and the segments to feed next (the rest of the prompt, or that token)."""
        import mlx.core as mx

        self.settle()

        if self._next is None:
            rest = self.prompt[len(self.fed):]
            return [], ([rest[:-1], rest[-1:]] if len(rest) > 1 else [rest])
        y, logprobs = self._next
        mx.eval(y, logprobs)
        token = cast(int, y.item())  # a token id
        return [(token, logprobs)], [[token]]

    def _forward(self, y: mx.array, laps: Laps | None = None) -> Pending:
        """Feed ``y`` (shape (1,), or a token and its forced run); the sampled next token
        and its log-probabilities (``laps``: each stage evaluated and timed, stages.py)."""
        import mlx.core as mx

        req = self.job.request
        if self.lean is not None and y.shape == (1,) and plain_caches(self.cache):
            logits = self.lean(y[None], self.cache)[:, -1, :]
        else:
            logits = self.model(y[None], cache=self.cache)[:, -1, :]
        if laps is not None:
            laps.lap(logits)
        if req.processors:
            if self._context is None:
                self._context = mx.concatenate([mx.array(self.fed), y]) if self.fed else y
            else:
                self._context = mx.concatenate([self._context, y])
            for processor in req.processors:
                logits = processor(self._context, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        assert req.sampler is not None  # prepare builds it before any lane runs the job
        if laps is None:
            return req.sampler(logprobs), logprobs.squeeze(0)
        laps.lap(logprobs)
        token = req.sampler(logprobs)
        laps.lap(token)
        return token, logprobs.squeeze(0)


def _steps(out: Any) -> list[Step]:
    """A speculative stream's step, one ``(token, logprobs)`` or a list of them, as the
    slot's ``(token, logprobs, run)`` entries (a guided stream's carry their runs)."""
    return [(e[0], e[1], e[2] if len(e) > 2 else []) for e in
            (out if isinstance(out, list) else [out])]
