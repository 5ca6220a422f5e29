"""The batch lane's lone-job slot: :class:`SoloSlot` starts a lone job as a
:class:`~.solo.Solo` (or, for a request drafting with the model's MTP head, a
:class:`~.solo_mtp.MtpSolo`), steps it, hands it into the batch when company arrives and
takes the batch's last row back out; with the helpers the lane shares (``deliver``,
``BatchRow``). Kept apart from the solo loops so both build on ``Solo``
without importing each other's users.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from ..job import GenerationJob
from ..memory import classify
from .pace import PrefillPacer
from .random_state import fresh_random_state
from .solo import Pending, Solo
from .solo_mtp import MtpSolo

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

    from ...contract import TokenPredictor
    from ...events import Retry
    from ..admission import Admission
    from ..batch.lean import LeanDecode
    from ..batch.tune import Verdict
    from ..speculate import HeadState
    from .tally import StepTally

log = logging.getLogger("mlxbun.engine")

Moving: TypeAlias = ("tuple[GenerationJob, list[Any] | None, list[int], list[list[int]], "
                      "HeadState | None]")
"""A lone job joining the batch: ``(job, cache, held, segments, head)`` (see
``SoloSlot.join``)."""


class Publish(Protocol):
    """The lane's prefix publishing: store ``job``'s KV ``cache`` of ``tokens``."""

    def __call__(self, job: GenerationJob, tokens: Sequence[int] | None,
                 cache: list[Any] | None, boundary: bool = False) -> None: ...


def deliver(job: GenerationJob, token: int, logprobs: mx.array,
            forced: Sequence[int] = ()) -> None:
    """Hand ``job`` one token (and the ``forced`` run fed after it); the first one
    closes its prefill phase."""
    if job.session.t_first is None and job.started is not None:
        job.session.phases["prefill_s"] = time.perf_counter() - job.started
    job.deliver(token, logprobs, forced)


class BatchRow:
    """A batch lane's row: its job, its prompt, and whether to publish the prompt-boundary KV."""

    __slots__ = ("job", "prompt", "snapshot")

    def __init__(self, job: GenerationJob, snapshot: bool):
        self.job = job
        self.prompt = job.request.prompt_tokens
        self.snapshot = snapshot  # publish the prompt-boundary KV (caches that cannot rewind)


class SoloSlot:
    """The batch lane's lone job, if any: started alone, stepped here, handed into the
    batch when company arrives (``join``) and back out when the batch drains to it
    (``resume``). The job's admission reservation, made by the lane, stays with it across
    both moves and is released when it ends here. ``publish(job, tokens, cache,
    boundary=False)`` and ``publishes(job)`` are the lane's prefix publishing; ``steps``
    counts its decode steps with the lane's (/metrics)."""

    def __init__(self, model: nn.Module, admission: Admission | None, publish: Publish,
                 publishes: Callable[[GenerationJob], bool], steps: StepTally) -> None:
        self.model, self.admission = model, admission
        self.publish, self.publishes = publish, publishes
        self.steps = steps
        self.solo: Solo | None = None
        self.predictor: TokenPredictor | None = None  # the MTP head of the lane's model
        self.fault: Callable[[], None] | None = None  # a test's injected fault (memory.py)
        self._lean: LeanDecode | None = None  # the lone stream's lean step (once probed)
        self._lean_probed = False
        self.step_verdict: Verdict | None = None  # how that way was decided (batch/tune.py)

    @property
    def job(self) -> GenerationJob | None:
        return None if self.solo is None else self.solo.job

    def start(self, job: GenerationJob, cache: list[Any] | None, cached: int,
              pacer: PrefillPacer) -> None:
        """Run ``job`` alone; ``cache`` holds its first ``cached`` prompt tokens (None:
        nothing cached, a fresh cache)."""
        t0 = time.perf_counter()
        if cache is None:
            from ... import cache_ops

            cache = cache_ops.make(self.model)
        if job.spec is not None and job.spec.kind == "mtp" and self.predictor is not None:
            self.solo = MtpSolo(self.model, job, cache, cached, pacer, self.predictor)
        else:
            self.solo = Solo(self.model, job, cache, cached, pacer, lean=self.lean())
        job.session.span("prefill.batch_setup", t0, lane="batched", alone=True)

    def step(self) -> None:
        """One prefill chunk or one token of the lone job."""
        solo = self.solo
        assert solo is not None  # the lane steps the slot only while it holds a job
        job = solo.job
        try:
            if self.fault is not None:
                self.fault()
            out = solo.step()
        except Exception as exc:  # report to the request, keep serving others
            if classify(exc) is not None:
                raise  # memory or the device: the lane's to meet (lanes/pressure.py)
            log.exception("generation failed")
            fresh_random_state()  # a failure inside a compiled sampler can leave it unusable
            self.end()
            job.close("error", str(exc))
            return
        if out is None:  # a prefill chunk
            if not solo.prefilling and self.publishes(job):
                t0 = time.perf_counter()
                boundary = solo.boundary()
                if boundary is not None:
                    self.publish(job, solo.fed, boundary, boundary=True)
                    job.session.span("prefill.kv_maintenance", t0, snapshot_tokens=len(solo.fed))
            return
        self.steps.add(1)
        for token, logprobs, run in out:
            deliver(job, token, logprobs, run)
            if job.finished:
                break
        if job.finished:
            solo.settle()
            self.publish(self.end(), solo.fed, solo.cache)

    def join(self) -> Moving | None:
        """Hand the lone job to the batch: ``(job, cache, held, segments, head)`` for the
        row that goes on from here (``cache`` holds ``held``; ``segments`` are fed next;
        ``head``: an MTP job's head, None for others), or None when the token it had
        already sampled ended it."""
        solo = self.solo
        assert solo is not None  # joins only while it holds a job
        tokens, segments = solo.handoff()
        job = solo.job
        if tokens:
            self.steps.add(1)  # the tokens its last lone step computed
            for token, logprobs in tokens:
                deliver(job, token, logprobs)
                if job.finished:
                    break
            if job.finished:
                self.publish(self.end(), solo.fed, solo.cache)
                return None
        self.solo = None  # the row keeps the admission reservation
        head = solo.head_state() if isinstance(solo, MtpSolo) else None
        return job, solo.cache if solo.fed else None, solo.fed, segments, head

    def resume(self, job: GenerationJob, cache: list[Any], fed: list[int],
               pending: Pending, pacer: PrefillPacer, head: HeadState | None = None) -> None:
        """The batch's last decoding row goes on alone: ``cache`` holds ``fed``;
        ``pending`` is the token the batch sampled from it and has not fed; ``head``: an
        MTP row's head (it drafts on alone)."""
        if head is not None and self.predictor is not None:
            self.solo = MtpSolo.resume_mtp(self.model, job, cache, fed, pending, pacer,
                                           self.predictor, head)
            return
        self.solo = Solo.resume(self.model, job, cache, fed, pending, pacer, self.lean())

    def lean(self) -> LeanDecode | None:
        """The lone stream's lean one-token step (``batch/lean.py``'s ``for_solo``),
        probed, and on a GPU timed against the model's call (``batch/tune.py``), at
        warm-up or the first lone job; None where the model takes its own call."""
        if not self._lean_probed:
            from ..batch import tune

            self._lean_probed = True
            self._lean, self.step_verdict = tune.for_solo(self.model)
        return self._lean

    def end(self) -> GenerationJob:
        """Empty the slot and release the job's reservation; the job."""
        job = self.take()
        if self.admission is not None:
            self.admission.release(job)
        return job

    def take(self) -> GenerationJob:
        """Empty the slot, dropping its KV; the job keeps its reservation (preempted)."""
        assert self.solo is not None
        job, self.solo = self.solo.job, None
        return job

    def drop_cancelled(self) -> None:
        solo = self.solo
        if solo is not None and solo.job.cancelled.is_set():
            if solo.job.keep_kv_on_cancel and not solo.prefilling:  # (gen_checkpoint.py)
                solo.settle()
                self.publish(solo.job, solo.fed, solo.cache)
            self.end().close("cancelled")

    def close(self, reason: str, error: str, retry: Retry | None = None) -> None:
        if self.solo is not None:
            self.end().close(reason, error, retry)
