"""What comes out of the batch lane's steps (a mixin of :class:`~.batch.BatchLane`):
tokens to their sessions, and every way a row leaves the batch.

A decode step's tokens go to their jobs (speculation counted, grammar-forced runs and all);
a finished row's blocks go to the prefix cache as they are (a block entry), or a row's
prompt boundary is snapshot there for caches that cannot rewind; the batch's last row goes
on alone, KV and all, as a lone stream (``solo.py``); cancelled rows end and free their
blocks, and a failed step ends every row (the pool dropped with it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..batch.entry import BlockEntry
from ..job import posts_held
from .admit import Admitting
from .slot import BatchRow, deliver

if TYPE_CHECKING:
    from ...events import Retry
    from ..batch import Batch, Emit
    from ..job import GenerationJob
    from .tally import StepTally


class Results(Admitting):
    """Tokens and rows out, for :class:`~.batch.BatchLane` (which holds what is declared
    here)."""

    steps: StepTally

    def _emitted(self, emits: list[Emit]) -> None:
        """A decode step's tokens, to their sessions."""
        uids = {e.uid for e in emits}
        if uids:  # a decode step that handed out tokens, and the rows it carried
            self.steps.add(len(uids))
            self.spec.stepped(uids)
            if self.mtp is not None:
                self.mtp.stepped(uids)
        with posts_held():  # the step's tokens reach the event loop in one wake-up
            for e in emits:
                self._route(e)

    def _forget(self, uid: int) -> BatchRow:
        self.spec.drop(uid)
        if self.mtp is not None:
            self.mtp.drop(uid)
        row = self._rows.pop(uid)
        if self.admission is not None:
            self.admission.release(row.job)
        self.governor.row_ended()
        return row

    def _route(self, e: Emit) -> None:
        row = self._rows.get(e.uid)
        if row is None:
            return
        job = row.job
        if e.drafted:
            counts = self.mtp if self.mtp is not None and e.uid in self.mtp.rows else self.spec
            counts.count(e.uid, e.drafted, e.accepted)
        self.spec.observe(e.uid, e.token)
        if not job.finished:
            deliver(job, e.token, e.logprobs, e.forced)
        if e.finish is not None and not job.finished:
            job.close("length")
        if job.finished:
            self._remove(e.uid, publish=True)

    def _remove(self, uid: int, publish: bool) -> None:
        """Drop row ``uid``; with ``publish`` its blocks go to the prefix cache as they are."""
        row = self._forget(uid)
        batch = self._get_batch()
        if publish and self._uses_prefix(row.job):
            entry, tokens = batch.detach(uid)
            self._publish(row.job, tokens, entry)
        else:
            batch.remove(uid)

    def _leave(self, batch: Batch) -> None:
        """The batch's one row, decoding with its next token sampled, goes on alone."""
        (uid,) = self._rows
        pending = batch.pending(uid)
        mtp = self.mtp if self.mtp is not None and uid in self.mtp.rows else None
        if pending is None or batch.prefilling or (batch.refeeding(uid) and mtp is None):
            return  # (a lone stream feeds nothing again: prompt lookup's row waits a step)
        cache, fed = batch.export(uid)
        head = None if mtp is None else mtp.leaving(uid, batch.refeeding(uid))
        job = self._rows.pop(uid).job  # it keeps its admission reservation
        self._note_first(batch, uid, job)
        batch.remove(uid)
        self.spec.drop(uid)
        if mtp is not None:
            mtp.drop(uid)
        self._solo.resume(job, cache, fed, pending, self._solo_pacer(), head)

    # -- prefix publishing ----------------------------------------------------------
    def _uses_prefix(self, job: GenerationJob) -> bool:
        """Whether ``job`` starts from, and publishes to, the prefix cache."""
        return job.cache_namespace is not None and self.prefix is not None

    def _publish(self, job: GenerationJob, tokens: Sequence[int] | None,
                 cache: list[Any] | BlockEntry | None, boundary: bool = False) -> None:
        """Store ``job``'s KV ``cache`` of ``tokens`` (``boundary``: a snapshot at the
        prompt's end, for caches that cannot rewind)."""
        if self._uses_prefix(job) and self.prefix is not None and tokens and cache:
            self.prefix.store(job.cache_namespace, list(tokens), cache, boundary=boundary)
        elif isinstance(cache, BlockEntry):
            cache.release()

    def _publish_boundary(self, uid: int) -> None:
        t0 = time.perf_counter()
        entry, tokens = self._get_batch().snapshot(uid)
        job = self._rows[uid].job
        self._publish(job, tokens, entry, boundary=True)
        job.session.span("prefill.kv_maintenance", t0, snapshot_tokens=len(tokens))

    def _drop_cancelled(self) -> None:
        self._solo.drop_cancelled()
        for uid in [u for u, row in self._rows.items() if row.job.cancelled.is_set()]:
            job = self._rows[uid].job
            self._remove(uid, publish=job.keep_kv_on_cancel)
            job.close("cancelled")
        if any(j.cancelled.is_set() for j in self._queue):
            for job in [j for j in self._queue if j.cancelled.is_set()]:
                self._queue.remove(job)
                self._release(job)  # (a preempted job still holds its reservation)
                job.close("cancelled")

    def _fail_all(self, error: str, reason: str = "error", retry: Retry | None = None) -> None:
        for uid in list(self._rows):
            self._forget(uid).job.close(reason, error, retry)
        if self._batch is not None:
            self._batch.close()
        if self.mtp is not None:
            self.mtp.reset()  # (a failed pass may have left the heads' pool half written too)
        if reason == "error" and self._batch is not None:
            # a failed pass may have left the pool unusable
            if self.prefix is not None:
                self.prefix.drop_layout(self._batch.layout)
            self._batch = None
