"""The batch lane under memory pressure: preempted rows, requests that wait for memory,
and the 503 once a wait is too long (a mixin of :class:`~.batch.BatchLane`).

- **Measured room.** Every step the block pool's limit follows the governor's reading of
  free memory (``engine/memory.py``); a request is admitted (and a preempted one taken
  back) only when its tokens fit in the room left, beside one block per running row.
- **Out of blocks** (the pool at its limit, nothing left to take from the prefix cache):
  a clean failure, raised before the step wrote anything. Rows whose state the step
  already moved are settled (a grammar's forced run is handed out; MTP heads drafted)
  and preempted, then the youngest rows until the step fits; the next step runs it.
- **Out of memory** (MLX raised mid-pass): the pass's writes may be anywhere, so the
  whole pool goes: MLX's cache is freed, every row is preempted, the pool and its prefix
  entries are dropped, and at most half as many rows run until steps succeed again. A
  second failure in a row clears the prefix cache too. One that persists while the lane
  holds a single request is pressure when memory reads short (that request gets a 503 to
  send again), else a device that cannot recover. Under ``--distributed`` it is
  a lost device at once (the ranks' collectives may be out of step:
  ``Governor.classify``).
- **Under a journal** (``--distributed``) preemption needs nothing of its own: a row's
  blocks go back to rank 0's free list (every pass names its blocks), its states are
  dropped through the journaled state operations, and its recompute is ordinary passes,
  all of which the other ranks replay.
- **Preempted** requests keep their admission reservation and their place: they go back
  to the front of the queue and are recomputed from their prompt and the tokens already
  handed out (``job.output``: greedy output equals an uninterrupted run; under a KV
  scheme the row's first pass reads what its first run's did, ``Row.first_kept``).
  Nothing new is admitted while one waits.
- **Waiting.** A request held back by memory (admission's reservations, the measured
  room, preempted requests ahead, the row cap after an out-of-memory) starts a clock;
  past ``--memory-wait`` it ends with a 503 and ``Retry-After`` (a preempted one that made
  no progress too; once its stream has started, as the stream's error event).
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Any

from ...events import Retry
from ..batch import BLOCK_SIZE, OutOfBlocks
from ..memory import DEVICE, DEVICE_FAULT, MEMORY_PRESSURE, OOM, Governor, classify
from .settle import Settle
from .slot import BatchRow, SoloSlot
from .stepfit import StepFit

if TYPE_CHECKING:
    import mlx.core as mx

    from ...kvquant import KVScheme
    from ..admission import Admission
    from ..batch import Batch
    from ..job import GenerationJob
    from ..prompt_cache import PrefixCache
    from ..speculate.batch import BatchSpeculator
    from ..speculate.mtp_batch import MtpBatch

log = logging.getLogger("mlxbun.engine")

GIVE_UP = 3  # failed steps in a row, with one request held, before the device is lost
IDLE_S = 0.02  # the lane's pause while every request waits for memory


def memory_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the pool or the device running out (or a device fault)."""
    return isinstance(exc, OutOfBlocks) or classify(exc) is not None


class Relief(Settle, StepFit):
    """Memory pressure for :class:`~.batch.BatchLane` (which holds what is declared here)."""

    governor: Governor
    kv: KVScheme
    admission: Admission | None
    prefix: PrefixCache | None
    cap: int
    spec: BatchSpeculator
    mtp: MtpBatch | None
    _rows: dict[int, BatchRow]
    _queue: collections.deque[GenerationJob]
    _batch: Batch | None
    _solo: SoloSlot

    def _forget(self, uid: int) -> BatchRow:
        raise NotImplementedError

    def _add_row(self, job: GenerationJob, cache: Any, held: list[int], todo: list[int],
                 head: Any = None, first: int = 0) -> int | None:
        raise NotImplementedError

    def _get_batch(self) -> Batch:
        raise NotImplementedError

    def _reclaim(self, blocks: int) -> int:
        raise NotImplementedError

    def _uses_prefix(self, job: GenerationJob) -> bool:
        raise NotImplementedError

    def _init_relief(self, governor: Governor) -> None:
        self.governor = governor
        self._planned = 1 << 40  # the pool's limit by admission's budget (set with the pool)
        self._row_cap = self.cap  # rows at most: halved by an out-of-memory, then regrown
        # grammar-forced runs the running decode step consumed: (token, logprobs, run)
        self._consumed: dict[int, tuple[int, mx.array, list[int]]] = {}
        self._deciding = False  # a decode step is running (MTP heads have drafted)
        self._ooms = 0  # out-of-memory failures since the last step that ran
        self._per_block = 0  # bytes of one of the pool's blocks, once known
        self._init_stepfit()  # room for a step's temporaries (stepfit.py)

    # -- the measured room -------------------------------------------------------------
    def _block_bytes(self) -> int:
        """Bytes of one block: the pool's own once it holds KV, else admission's estimate
        (0: no limit)."""
        if not self._per_block and self._batch is not None:
            self._per_block = self._batch.layout.bytes_per_block()  # (fixed once written)
        if self._per_block:
            return self._per_block
        if self.admission is None:
            return 0
        return int(self.admission.layout.bytes_per_token * BLOCK_SIZE)

    def _limit(self, batch: Batch, fresh: bool = False, tokens: int = 0) -> None:
        """The pool's limit from the memory free now (admission's plan the ceiling), the
        widest step's room kept (``tokens``: a newcomer's, stepfit.py)."""
        pool = batch.pool
        pool.limit = self.governor.pool_limit(self._planned, pool.capacity, self._block_bytes(),
                                              fresh, self._step_reserve(tokens),
                                              batch.layout.regrown_bytes())

    def _outstanding(self) -> int:
        """Blocks the running rows still take: the rest of each prompt, and the next
        position of each."""
        batch = self._batch
        if batch is None:
            return 0
        bs = batch.pool.block_size
        return sum(max(0, -(-(r.table.length + len(r.todo) + len(r.refeed) + 1) // bs)
                       - len(r.table.blocks)) for r in batch.rows.values())

    def _fits_now(self, job: GenerationJob) -> bool:
        """Whether ``job``'s tokens fit in the room memory leaves now, beside what the
        running rows still take, the prefix cache's blocks taken back if they must."""
        per_block = self._block_bytes()
        if per_block <= 0:
            return True
        tokens = len(job.request.prompt_tokens) + len(job.output) + 1
        need = -(-tokens // BLOCK_SIZE) + self._outstanding()
        batch = self._batch
        if batch is None:
            want = need * per_block + self._step_reserve(tokens)
            return want <= self.governor.room(want)
        if not self._decode_fits(tokens):
            return False
        self._limit(batch, tokens=tokens)
        pool = batch.pool
        if pool.room < need and self.governor.reclaim():  # MLX's cache back first
            self._limit(batch, tokens=tokens)
        if pool.room < need and self.prefix is not None:
            self._reclaim(need - (pool.limit - pool.capacity))
        return pool.room >= need

    # -- preempting --------------------------------------------------------------------
    def _hold(self, job: GenerationJob) -> None:
        """Mark ``job`` preempted; its memory clock runs on unless it made progress."""
        job.preempted = True
        if job.waiting_since is None or len(job.output) > job.progress_mark:
            job.waiting_since = time.monotonic()
        job.progress_mark = len(job.output)

    def _preempt(self, uids: list[int], keep_pool: bool) -> int:
        """Drop rows ``uids`` (their blocks freed when ``keep_pool``; else the pool is
        dropped after) and queue their jobs first, oldest first; how many wait."""
        batch, held = self._batch, []
        for uid in uids:
            row = self._rows.pop(uid)
            self.spec.drop(uid)
            if self.mtp is not None:
                self.mtp.drop(uid)
            if batch is not None:
                self._note_first(batch, uid, row.job)
                if keep_pool:
                    batch.remove(uid)
            if row.job.finished:  # what was settled ended it
                self._release(row.job)
                self.governor.row_ended()
                continue
            self._hold(row.job)
            held.append(row.job)
        self._queue.extendleft(reversed(held))
        self.governor.counts["preemptions"] += len(held)
        return len(held)

    def _note_first(self, batch: Batch, uid: int, job: GenerationJob) -> None:
        """Keep what row ``uid``'s first pass read on its job, for a row recomputed
        under a KV scheme to read as much first (``Row.first_kept``)."""
        if self.kv.enabled and not job.first_pass:
            job.first_pass = batch.rows[uid].first_kept

    def _preempt_solo(self) -> int:
        """Drop the lone job's KV and queue it first; 1 when there was one."""
        if self._solo.job is None:
            return 0
        job = self._solo.take()
        self._hold(job)
        self._queue.appendleft(job)
        self.governor.counts["preemptions"] += 1
        return 1

    def _lookup(self, job: GenerationJob, tokens: list[int]) -> tuple[Any, int]:
        """A preempted job's way back: the longest cached prefix of its prompt and
        output, which are fed as a prompt (the next token is sampled as it would have
        been)."""
        if self._uses_prefix(job) and self.prefix is not None:
            return self.prefix.lookup(job.cache_namespace, tokens, self._get_batch().layout)
        return None, 0

    def _not_added(self, job: GenerationJob, exc: BaseException) -> None:
        """``job`` could not join the batch: it waits for memory (first in line), or
        ends with the failure."""
        if memory_failure(exc):  # (a device fault: the lane then ends it with the rest)
            self._hold(job)
            self._queue.appendleft(job)
            return
        self._release(job)
        job.close("error", str(exc))

    def _release(self, job: GenerationJob) -> None:
        if self.admission is not None:
            self.admission.release(job)

    # -- failures ----------------------------------------------------------------------
    def _relieve(self, exc: Exception) -> bool:
        """Meet a step's failure when memory or the device caused it; False otherwise."""
        if isinstance(exc, OutOfBlocks):
            self._short_of_blocks(exc)
            return True
        kind = self.governor.classify(exc)  # (an out-of-memory under --distributed: DEVICE)
        if kind == DEVICE:
            self._broken(self.governor.fault_reason(exc))
        elif kind == OOM:
            self._out_of_memory(exc)
        return kind is not None

    def _short_of_blocks(self, exc: OutOfBlocks) -> None:
        gov = self.governor
        gov.counts["out_of_blocks"] += 1
        gov.failed()
        batch = self._batch
        moved = set(self._consumed) & set(self._rows)  # their fill consumed a run
        if self._deciding and self.mtp is not None:  # their heads drafted for this step
            moved |= set(self.mtp.rows) & set(self._rows)
        self._deciding = False
        self._settle(sorted(moved))
        n = self._preempt(sorted(moved), keep_pool=True)
        if batch is not None:
            self._limit(batch, fresh=True)
            while self._rows and batch.pool.room < self._outstanding():
                young = [max(self._rows)]
                self._settle(young)
                n += self._preempt(young, keep_pool=True)
        log.warning("out of KV blocks (%s): preempted %d, recomputed when memory allows",
                    exc, n)

    def _out_of_memory(self, exc: Exception) -> None:
        import mlx.core as mx

        gov = self.governor
        gov.counts["out_of_memory"] += 1
        gov.failed()
        self._ooms += 1
        held = len(self._rows) + (self._solo.job is not None)
        stuck = self._ooms >= GIVE_UP and held <= 1
        self._settle(sorted(self._rows))
        self._deciding = False
        n = self._preempt(sorted(self._rows), keep_pool=False) + self._preempt_solo()
        batch, self._batch = self._batch, None  # its storage may hold the failed writes
        if batch is not None and self.prefix is not None:
            self.prefix.drop_layout(batch.layout)
        if self.mtp is not None:
            self.mtp.reset()
        if self._ooms >= 2 and self.prefix is not None:
            self.prefix.clear()
        mx.clear_cache()  # (not after letting the failed pass's frames go: on CUDA, after a
        # failed graph instantiation, that order met an illegal memory access here)
        gov.available(fresh=True)
        self._row_cap = max(1, held // 2)
        if stuck:
            return self._stuck(exc)
        log.warning("out of memory (%s): MLX's cache and the KV pool freed, preempted %d, "
                    "recomputed when memory allows", str(exc).splitlines()[0], n)

    def _stuck(self, exc: Exception) -> None:
        """Allocations kept failing with one request left and everything else freed.
        Memory that reads short (another process holds it) is pressure: that request
        cannot be served now, a 503 to send again, and the engine goes on. Memory that
        reads ample while allocations still fail is a device that cannot recover."""
        gov = self.governor
        need = gov.margin + gov.step["peak_bytes"]
        reading = gov.reading
        if reading is None or reading.available >= need:
            return self._broken(f"allocations keep failing with one request left and "
                                f"{_gib(reading.available if reading else 0)} free: {exc}")
        self._ooms = 0
        if self._queue:
            self._refuse(self._queue.popleft(),
                         f"not enough memory to run this request now "
                         f"({_gib(reading.available)} free on the device)")
        log.warning("out of memory (%s) with one request left: %s free, %s wanted; it is "
                    "told to retry and the engine goes on", str(exc).splitlines()[0],
                    _gib(reading.available), _gib(need))

    def _broken(self, reason: str) -> None:
        """The device is lost: every request ends with a 503 to send again to the
        restarted engine (an error event where a stream has started); nothing here
        touches MLX again."""
        gov = self.governor
        gov.lost(reason)
        retry = Retry(gov.restart_after, DEVICE_FAULT)
        message = f"the device failed ({reason}); the engine is restarting"
        for uid in list(self._rows):
            self._forget(uid).job.close("error", message, retry)
        self._batch = None
        self._solo.close("error", message, retry)
        while self._queue:
            job = self._queue.popleft()
            self._release(job)
            job.close("error", message, retry)

    def _stepped(self, grow: bool) -> None:
        """A step ran: failures in a row are over; the row cap an out-of-memory lowered
        grows back by one once the rows it let in all hand out tokens (``grow``), so a
        prefill of newcomers never keeps them from getting anywhere."""
        self._ooms = 0
        if grow and self._row_cap < self.cap:
            self._row_cap += 1

    # -- waiting -----------------------------------------------------------------------
    def _clock(self, blocked: bool) -> None:
        """Queued requests' memory clocks: running while memory holds the queue back,
        reset when it does not (a preempted request's runs until it progresses)."""
        now = time.monotonic()
        for job in self._queue:
            if blocked and job.waiting_since is None:
                job.waiting_since = now
            elif not blocked and not job.preempted:
                job.waiting_since = None

    def _refuse_overdue(self) -> None:
        """End the requests that waited for memory longer than the limit with a 503."""
        wait = self.governor.config.wait_s
        if wait <= 0 or not self._queue:
            return
        now = time.monotonic()
        late = [j for j in self._queue
                if j.waiting_since is not None and now - j.waiting_since > wait]
        for job in late:
            self._queue.remove(job)
            waited = now - (job.waiting_since or now)  # (its 503 is the request's log line)
            self._refuse(job, f"not enough memory to run this request now (waited "
                              f"{waited:.1f} s)")

    def _refuse(self, job: GenerationJob, why: str) -> None:
        """End ``job``, out of the queue, with a 503 and ``Retry-After``."""
        self._release(job)
        gov = self.governor
        gov.counts["refused"] += 1
        retry = Retry(gov.retry_after(), MEMORY_PRESSURE)
        job.close("error", f"{why}; retry after {retry.after} s", retry)

    def _idle(self) -> None:
        """Nothing runs and requests wait for memory: pause instead of spinning."""
        if self._queue:
            time.sleep(IDLE_S)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
