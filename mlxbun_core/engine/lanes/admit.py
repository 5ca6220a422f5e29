"""The batch lane's admission (a mixin of :class:`~.batch.BatchLane`): which waiting jobs
start, and how a row starts.

A job joins when the batch has a free row (the lane's cap, lowered for a while after an
out-of-memory), its adapter group runs, admission's reservations leave room for its
worst case beside the rows running, and the memory free now holds its tokens
(``pressure.py``); a lone job of its group decodes outside the batch (``slot.py``; never
under a journal: ``--distributed``). A preempted job comes back first, from its prompt
and the tokens it already handed out. A row starts from the longest cached prefix of its
tokens: blocks shared from the pool, or mlx-lm caches loaded into fresh blocks.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from ..batch import OutOfBlocks
from ..batch.entry import Shared
from ..cache_explain import Probe, explain_job
from .pace import FixedChunk
from .pressure import Relief
from .slot import BatchRow

if TYPE_CHECKING:
    from ...adapters import AdapterManager
    from ..batch.journal import Journal
    from ..job import GenerationJob
    from ..speculate import HeadState
    from .pace import PrefillPacer

NO_LIMIT = 1 << 30


class Admitting(Relief):
    """Admission for :class:`~.batch.BatchLane` (which holds what is declared here)."""

    name: str
    adapters: AdapterManager | None
    journal: Journal | None
    solo_prefill: int | None
    _group: str
    _uids: itertools.count[int]
    pacer: PrefillPacer

    @property
    def alone(self) -> bool:
        raise NotImplementedError

    def _wants_mtp(self, job: GenerationJob) -> bool:
        raise NotImplementedError

    def _rewindable(self) -> bool:
        raise NotImplementedError

    def _admit(self) -> None:
        if self.alone:
            return  # it joins the batch first (step), or runs on alone
        self._clock(self._admit_jobs())

    def _admit_jobs(self) -> bool:
        """Admit what fits; whether memory held a job back (pressure.py)."""
        fresh = not self._rows
        if fresh and self._queue:
            self._group = self._group_of(self._queue[0])
            head = self._queue[0]
            if not head.preempted and self.journal is None and \
                    sum(self._group_of(j) == self._group for j in self._queue) == 1:
                if not self._fits_now(head):
                    return True
                job = self._queue.popleft()  # alone it must run: bounded to the budget at start
                cache, n = self._take(job, dense=True)
                assert not isinstance(cache, Shared)  # (dense)
                self._solo.start(job, cache, n, self._solo_pacer())
                return False
        i = 0
        while i < len(self._queue) and len(self._rows) < min(self.cap, self._row_cap):
            job = self._queue[i]
            if self._group_of(job) != self._group:
                if not fresh:
                    return False  # another adapter group waits: let this batch drain
                i += 1  # a fresh batch gathers every waiting job of its set
                continue
            if not job.preempted and self.admission is not None and self._rows \
                    and not self.admission.fits(job):
                return True  # wait for a row to finish and free its KV
            # (with no rows it must run: its limit was bounded to the budget at start)
            if not self._fits_now(job):
                return True  # the memory free now cannot hold it (or a preempted one)
            del self._queue[i]
            self._insert(job)
            if job.preempted:
                return True  # no room after all: it waits first in line
        # the row cap an out-of-memory lowered holds the rest back
        return bool(self._queue) and len(self._rows) >= self._row_cap < self.cap

    def _group_of(self, job: GenerationJob) -> str:
        """The batch ``job`` may join (its adapter set's group)."""
        return "" if self.adapters is None else self.adapters.group(job.adapters)

    def _take(self, job: GenerationJob, dense: bool = False
              ) -> tuple[list[Any] | Shared | None, int]:
        """Admit ``job``: reserve its KV, then ``(cache, n)``, the longest cached prefix
        of its prompt: blocks shared from the batch's pool, or (``dense``, or an entry
        the serial lane left) mlx-lm caches."""
        if self.admission is not None:
            self.admission.reserve(job)
        job.mark_started(self.name)
        if self._wants_mtp(job):
            job.session.usage.lane = f"{self.name}+spec"
        cache: list[Any] | Shared | None = None
        n, t0, note = 0, time.perf_counter(), None
        if self._uses_prefix(job) and self.prefix is not None:
            layout = None if dense else self._get_batch().layout
            probe = Probe()
            cache, n = self.prefix.lookup(job.cache_namespace, job.request.prompt_tokens,
                                          layout, probe)
            note = explain_job(self.prefix, job, probe, n)
        job.session.phases["cache_lookup_s"] = time.perf_counter() - t0
        job.admitted(n, note)
        return cache, n

    def _insert(self, job: GenerationJob) -> None:
        """Start ``job``'s row; a preempted job's again, from its prompt and output."""
        resumed = job.preempted
        tokens = [*job.request.prompt_tokens, *job.output]
        try:
            cache, n = self._lookup(job, tokens) if resumed else self._take(job)
        except Exception as exc:
            self._not_added(job, exc)  # waits for memory, or ends with the failure
            raise
        job.preempted = False
        first = job.first_pass if resumed and not n else 0  # (KV schemes: Row.first_kept)
        uid = self._add_row(job, cache, tokens[:n], tokens[n:], first=first)
        if resumed and uid is not None:
            self._rows[uid].snapshot = False  # (not at its prompt's boundary)

    def _add_row(self, job: GenerationJob, cache: list[Any] | Shared | None,
                 held: list[int], todo: list[int], head: HeadState | None = None,
                 first: int = 0) -> int | None:
        """Start a row whose KV ``cache`` (shared blocks, or mlx-lm caches) holds the
        tokens ``held``; ``todo`` is fed next (a row snapshots its prompt boundary when it
        reads more than one token and its cache cannot rewind; ``head``: a lone MTP job's
        head; ``first``: tokens its first pass reads); its uid (None: no room, the job
        waits first in line)."""
        left = job.limit - job.session.usage.completion_tokens if job.limit else NO_LIMIT
        uid = next(self._uids)
        mtp = self.mtp if self._wants_mtp(job) else None
        shared = cache if isinstance(cache, Shared) else None
        dense = None if shared is not None else cache
        assert not isinstance(dense, Shared)
        t0 = time.perf_counter()
        try:
            self._get_batch().add(uid, todo, cache=dense, shared=shared, held=held,
                                  sampler=job.request.sampler,
                                  processors=job.request.processors, budget=left,
                                  tapped=mtp is not None,
                                  refeed=head.refeed if head is not None else (),
                                  first=first)
        except Exception as exc:
            self._not_added(job, exc)  # waits for memory, or ends with the failure
            if isinstance(exc, OutOfBlocks):
                return None
            raise
        job.session.span("prefill.batch_setup", t0, lane=self.name, held_tokens=len(held))
        snapshot = self._uses_prefix(job) and len(todo) > 1 and not self._rewindable()
        self._rows[uid] = BatchRow(job, snapshot)
        if job.spec is not None:
            self.spec.tally = job.spec_tally
        if mtp is not None and job.spec is not None:
            mtp.tally = job.spec_tally
            mtp.add(uid, job.spec.num_draft_tokens or mtp.predictor.num_draft_tokens,
                    job.request.sampler, job.session.usage, head)
        elif job.spec is not None:
            self.spec.add(uid, job.spec, [*held, *todo], job.session.usage)
        return uid

    def _solo_pacer(self) -> PrefillPacer:
        return self.pacer if self.solo_prefill is None else FixedChunk(self.solo_prefill)
