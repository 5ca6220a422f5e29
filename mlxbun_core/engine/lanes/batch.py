"""The batch lane: continuous batching on the engine's own batch (``engine/batch/``).

Each ``step`` admits waiting jobs that fit (row cap, memory: ``admit.py``), asks the
scheduler for a plan (which prompts read how much, whether rows decode), has the batch
run it, routes each row's tokens to its session and removes finished or cancelled rows
(``results.py``: every way a row leaves the batch). KV lives in the block pool; per-row
samplers, logits processors (penalties, logit_bias, grammar masks) and logprobs ride
with each row. Rows start from the longest cached prefix and publish their KV to the
prefix cache when they end. Memory pressure (a pool out of blocks, an out-of-memory
from MLX, a device that fails) is met in ``pressure.py``: rows are preempted and
recomputed, waits end in a 503.

A job alone in the lane decodes outside the batch (``solo.py``: a lone stream at
mlx-lm's single-sequence speed, kept in the lane's ``SoloSlot``) and joins the batch,
KV and all, as soon as another job of its adapter set arrives; a batch that drains to
one decoding row hands that row back out the same way.

Speculation rides in the batch's decode step: prompt lookup's drafts
(``speculate/batch.py``) and the model's MTP head's (``speculate/mtp_batch.py``: the
batch's tap, drafting on the device from each MTP row's hidden states; a lone MTP job
decodes in ``solo_mtp.py`` and moves in and out with its head).

Under ``--distributed`` the batch keeps a journal for the other ranks to replay
(``batch/journal.py``): every job stays a batch row, the prefix cache keeps block entries
and mlx-lm caches apart (``PrefixCache.kinds_apart``) and no row drafts with the MTP head.

LoRA adapter sets mix in one batch: each forward pass routes its rows to their own
sets (``adapters/rows.py``; the base model is the empty set). Sets that cannot run
per row (``AdapterManager.group``) run one per batch: a fresh batch takes the oldest
waiting job's group and every waiting job of that group; while it runs, newcomers of
the group join until a job of another group is oldest in line, then the batch drains
and that group goes next (bounded waiting).
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from ... import kvquant
from ...adapters.sets import AdapterSet
from ...events import Retry
from ...runconfig import current
from ..batch import Batch, Emit, direct, lean, pool_for, tune
from ..batch.journal import Journal
from ..batch.layout import RECURRENT, Slot, layout
from ..batch.warm import warm as warm_batch
from ..fill.rows import forcing
from ..job import GenerationJob
from ..memory import Governor
from ..prompt_cache import PrefixCache, trimmable
from ..scheduler import PREFILL_TOKENS, Scheduler, StepPlan
from ..speculate import MTP
from ..speculate.batch import BatchSpeculator
from ..speculate.mtp_batch import MtpBatch
from ..stages import tracing
from .idle import IdleRelease
from .pace import PrefillPacer
from .pressure import memory_failure
from .results import Results
from .slot import BatchRow, SoloSlot
from .tally import StepTally

if TYPE_CHECKING:
    import mlx.nn as nn

    from ...adapters import AdapterManager
    from ...contract import TokenPredictor
    from ..admission import Admission

log = logging.getLogger("mlxbun.engine")


class BatchLane(Results, IdleRelease):
    name = "batched"

    def __init__(self, model: nn.Module, cap: int, prefix: PrefixCache | None = None,
                 admission: Admission | None = None, prefill_tokens: int = PREFILL_TOKENS,
                 adapters: AdapterManager | None = None, pacer: PrefillPacer | None = None,
                 kv: kvquant.KVScheme = kvquant.OFF,
                 predictor: TokenPredictor | None = None,
                 governor: Governor | None = None) -> None:
        self.kv = kv  # the KV scheme: quantized blocks in the batch, a lone stream's
        self.model = kvquant.quantizing(model, kv)  # cache quantized after every call
        self._net = model  # the batch's own blocks quantize themselves
        self.adapters = adapters  # the engine's AdapterManager (None: no LoRA support)
        self._group = ""  # the adapter group of the running rows (AdapterManager.group)
        self.cap = cap
        self.prefix = prefix
        self.admission = admission
        self._batch: Batch | None = None  # made on the worker thread at first use
        # the decode step the first batch's timing chose (batch/tune.py), and its lean
        # forward, which later batches over the model take over (None: not yet decided)
        self.decode_step: tune.Verdict | None = None
        self._lean: lean.LeanDecode | None = None
        # a distributed serve's record of the batch (the lockstep model's)
        journal = getattr(model, "journal", None)
        self.journal = journal if isinstance(journal, Journal) else None
        if self.journal is not None and prefix is not None:
            prefix.kinds_apart = True
        self._slots = batch_layout(model)  # None: these caches stay out of the batch
        self._uids = itertools.count()
        self._queue: collections.deque[GenerationJob] = collections.deque()
        self._rows: dict[int, BatchRow] = {}
        self.steps = StepTally()  # decode steps and the rows they carried (/metrics)
        # a lone job decoding outside the batch
        self._solo = SoloSlot(self.model, admission, self._publish, self._uses_prefix,
                              self.steps)
        # prompt tokens per chunk, from measured speed (the scheduler's, see ``pacer``)
        self.scheduler = Scheduler(pacer or PrefillPacer(), prefill_tokens)
        self.solo_prefill: int | None = None  # pins the lone job's chunk (tests)
        self.spec = BatchSpeculator()  # rows' prompt lookup (speculate/batch.py)
        # rows drafting with the model's MTP head (speculate/mtp_batch.py); none under a KV
        # scheme (the engine has such requests decode plainly, admission bills no head) or
        # a journal (the distributed engine has no head)
        self.predictor = predictor if not kv.enabled and self.journal is None else None
        self.mtp = MtpBatch(self.predictor) if self.predictor is not None else None
        self._solo.predictor = self.predictor  # a lone MTP job drafts there (solo_mtp.py)
        # memory: the measured budget, preemption, waits and faults (pressure.py)
        self._init_relief(governor or Governor())
        self._solo.fault = self.governor.inject
        self._init_idle()  # memory given back when idle (idle.py)

    # -- the Lane protocol ---------------------------------------------------------
    def accepts(self, job: GenerationJob) -> bool:
        req = job.request
        # a draft, prompt embeddings, media, a seed (reproducible only alone), a scored
        # prompt, no completion budget (echo), MTP speculation the batch cannot run or a
        # model whose caches cannot be paged take the serial lane
        return (job.draft is None and req.input_embeddings is None and req.media is None
                and req.sampling.seed is None and not req.score_prompt and job.limit != 0
                and self._slots is not None
                and (not self._wants_mtp(job) or self._runs_mtp(job)
                     or self._plain_mtp(job)))

    def _wants_mtp(self, job: GenerationJob) -> bool:
        return job.spec is not None and job.spec.kind == MTP

    def _runs_mtp(self, job: GenerationJob) -> bool:
        """Whether ``job``'s MTP speculation runs here: the head's cache must page (rows
        with logits processors, a grammar's too, walk the head's guesses under them:
        ``speculate/mtp_guided.py``)."""
        return self.mtp is not None and self.mtp.supported()

    def _plain_mtp(self, job: GenerationJob) -> bool:
        """An MTP job under a grammar on a lane without a head it can page (a KV scheme,
        a distributed group): it decodes here plainly, concurrent constrained requests
        stay batched."""
        return (job.request.grammar is not None and not self._runs_mtp(job)
                and self._wants_mtp(job))

    def add(self, job: GenerationJob) -> None:
        if self._plain_mtp(job):
            job.spec = None
        self._queue.append(job)

    def pool_stats(self) -> dict[str, Any] | None:
        """``/stats`` ``batch.kv_blocks``: the block pool's numbers, the bytes its blocks
        really take per token (quantized ones under ``--kv-quant``) and that flag's value;
        None before the batch's first row."""
        b = self._batch
        if b is None:
            return None
        per_block = b.layout.bytes_per_block()
        return {**b.pool.stats(per_block), "swapped": 0, **self.released,
                "bytes_per_token": per_block / b.pool.block_size,
                "kv_quant": self.kv.flag, "direct_attention": b.direct}

    @property
    def pacer(self) -> PrefillPacer:
        return self.scheduler.pacer

    @pacer.setter
    def pacer(self, pacer: PrefillPacer) -> None:
        self.scheduler.pacer = pacer

    @property
    def active(self) -> int:
        return len(self._rows) + (self._solo.job is not None)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    exclusive = False

    def jobs(self) -> list[GenerationJob]:
        solo = self._solo.job
        return [r.job for r in dict(self._rows).values()] + list(self._queue) + \
            ([solo] if solo is not None else [])

    @property
    def alone(self) -> bool:
        """Whether a lone job is decoding outside the batch."""
        return self._solo.job is not None

    def step(self) -> None:
        self._worked()
        self._drop_cancelled()
        if self.governor.broken is not None:  # the device is lost: end what came since
            return self._broken(self.governor.broken)
        try:
            self._step()
        except Exception as exc:  # memory and the device are met here (pressure.py)
            if not self._relieve(exc):
                raise  # the worker ends this lane's jobs with the error

    def _step(self) -> None:
        self._refuse_overdue()
        if self.alone and any(self._group_of(j) == self._group for j in self._queue):
            moving = self._solo.join()  # company arrived: the lone job moves into the batch
            if moving is not None:  # (None: the token it had sampled already ended it)
                job, cache, held, segments, head = moving
                self._add_row(job, cache, held, [t for seg in segments for t in seg], head)
        self._admit()
        if not self._rows and not self.alone:
            return self._idle()
        if self._batch is not None:  # memory short: the pool's free top goes back (idle.py)
            self._trim_if_short(self._batch)
        lone = self._solo.job
        if lone is not None:
            if self.adapters is not None:  # the serial lane may have run another set meanwhile
                self.adapters.activate(lone.adapters)
            self._solo.step()
            if lone.finished:
                self.governor.row_ended()
            return self._stepped(grow=True)
        batch = self._get_batch()
        self._limit(batch)
        plan = self.scheduler.plan([(u, len(batch.rows[u].todo) - 1) for u in batch.prefilling],
                                   len(batch.decoding))
        plan = self._fit_plan(batch, plan)  # its temporaries fit the room (stepfit.py)
        try:
            emits = self._run(batch, plan)
        except Exception as exc:  # a failed forward fails every row; the lane starts afresh
            if memory_failure(exc):
                raise
            log.exception("batch step failed")
            return self._fail_all(str(exc))
        self._stepped(grow=self._row_cap < self.cap and bool(emits) and not batch.prefilling)
        if len(self._rows) == 1 and not self._queue and self.journal is None:
            self._leave(batch)  # the last row goes on alone

    def _run(self, batch: Batch, plan: StepPlan) -> list[Emit]:
        """Run ``plan``: the decode step first (its tokens go out at once, so a chunk that
        fails after it loses none), then the chunk; the tokens handed out."""
        self._deciding, self._consumed = False, {}
        emits: list[Emit] = []
        if plan.decode:
            rows = [self._rows[u].job for u in batch.decoding]
            fills = self._fills() if any(j.fill is not None for j in rows) else None
            drafts: dict[int, Any] = self.spec.drafts(batch.decoding)
            self._deciding = True
            if self.mtp is not None and self.mtp.rows:
                drafts.update(self.mtp.drafts(batch))
            batch.timed = tracing()
            emits = batch.decode(drafts=drafts, forcing=self._recorded(batch, fills,
                                                                       forcing(fills))
                                 if fills else None)
            self._deciding, self._consumed = False, {}
            self._traced_zero(batch, len(rows))
            self._emitted(emits)
        if plan.prefill:
            t0 = time.perf_counter()
            with self.pacer.timed(plan.asked) as timer:
                done = batch.prefill(plan.prefill)
                timer.tokens = sum(plan.prefill.values())
            for uid, n in plan.prefill.items():
                self._rows[uid].job.session.span("prefill.chunk", t0, tokens=n,
                                                 rows=len(plan.prefill))
            for uid in done:
                if self._rows[uid].snapshot:
                    self._publish_boundary(uid)
        return emits

    def _traced_zero(self, batch: Batch, rows: int) -> None:
        """Token zero's stages for the rows whose first token that step sampled."""
        if batch.zero is not None:
            uids, laps = batch.zero
            batch.zero = None
            for uid in uids:
                if uid in self._rows:
                    self._rows[uid].job.session.spanned(laps.spans(rows=rows))

    def close(self, error: str = "server shutting down", reason: str = "cancelled",
              retry: Retry | None = None) -> None:
        self._solo.close(reason, error, retry)
        self._fail_all(error, reason=reason, retry=retry)
        while self._queue:
            job = self._queue.popleft()
            self._release(job)  # (a preempted job still holds its reservation)
            job.close(reason, error, retry)

    def _rewindable(self) -> bool:
        if not hasattr(self, "_can_trim"):
            from ... import cache_ops

            self._can_trim = trimmable(cache_ops.make(self.model))
        return self._can_trim

    def _get_batch(self) -> Batch:
        if self._batch is None:
            assert self._slots is not None  # (accepts)
            route = None if self.adapters is None else self._route_rows
            cached = self.prefix.max_bytes if self.prefix is not None else 0
            self._batch = Batch(self._net, self._slots,
                                pool_for(self._slots, self.admission, cached),
                                before=route, reclaim=self._reclaim, tap=self.mtp, kv=self.kv,
                                journal=self.journal)
            direct.probe(self._batch)  # attention straight over blocks, where the model allows
            self._decide_step(self._batch)
            self._batch.fault = self.governor.inject
            self.governor.held = self._pool_bytes
            self._planned = self._batch.pool.limit
        return self._batch

    def _decide_step(self, batch: Batch) -> None:
        """A lighter decode graph where it gives the same logits (``batch/lean.py``), the
        way of it timed by the first batch and kept by those after (``batch/tune.py``)."""
        if self.decode_step is not None and self.decode_step.way == "model":
            return  # (no lean step to probe again)
        if not lean.probe(batch, self._lean):
            return
        self._lean = batch.lean if isinstance(batch.lean, lean.LeanDecode) else None
        if self.decode_step is None:
            self.decode_step = tune.choose(batch, rows=max(2, min(tune.ROWS, self.cap)))
        else:
            tune.apply(batch, self.decode_step.way, self._lean)

    def _pool_bytes(self) -> int:
        """Bytes the block pool's storage holds now (0: no batch)."""
        return self._batch.layout.nbytes if self._batch is not None else 0

    def warm(self) -> dict[str, Any]:
        """The batch's passes once at two scratch rows (``batch/warm.py``), on the worker
        at start: the passes run, the most blocks the rows held and the blocks left after
        (empty: nothing when there is no batch here, or a distributed group's, whose
        followers replay only real steps). Adapter routing and fault injection are off
        meanwhile (the rows are no job's). The batch is dropped after: an idle server holds
        no KV blocks, so memory is measured as before; MLX keeps what it compiled. The
        lone stream's lean-step probe and the batch's decode-step timing (on a GPU) run
        here too, off the first request's clock."""
        if self.journal is None:
            self._solo.lean()
        if self._slots is None or self.journal is not None or self._batch is not None:
            return {}
        import mlx.core as mx

        batch = self._get_batch()
        batch.before = batch.fault = None
        try:
            passes, held = warm_batch(batch)
            return {"passes": passes, "blocks_held": held, "blocks_left": batch.pool.used,
                    "decode_step": self.decode_step.stats() if self.decode_step else None,
                    "solo_step": verdict.stats() if (verdict := self._solo.step_verdict)
                    else None}
        finally:
            self._batch = None
            mx.clear_cache()

    def _reclaim(self, blocks: int) -> int:
        """The pool ran short: give it the prefix cache's blocks, oldest entries first."""
        if self.prefix is None or self._batch is None:
            return 0
        return self.prefix.reclaim(self._batch.layout, blocks)

    def _route_rows(self, uids: list[int]) -> None:
        """Route a forward pass by the adapter sets of the rows it carries."""
        if self.adapters is not None:
            self.adapters.route(self._rows_sets(uids), self._rows_sets)

    def _rows_sets(self, uids: list[int] | None = None) -> list[AdapterSet]:
        """The adapter sets of the rows ``uids`` (None: every row), for routing a pass."""
        rows = self._rows
        if uids is None:
            return [row.job.adapters for row in rows.values()]
        return [rows[uid].job.adapters for uid in uids]

    def _fills(self) -> dict[int, Any]:
        return {u: r.job.fill for u, r in self._rows.items() if r.job.fill is not None}


def batch_layout(model: Any) -> list[Slot] | None:
    """The batch's slots for ``model``'s layers; None when some layer's cache cannot be
    paged, or it keeps recurrent state and ``MLXBUN_BATCH_SSM=0`` sends such models to
    the serial lane."""
    slots = layout(model)
    if slots is not None and not current().engine.batch_ssm \
            and any(s.kind == RECURRENT for s in slots):
        log.info("MLXBUN_BATCH_SSM=0: a model with recurrent layers decodes on the "
                 "serial lane")
        return None
    return slots
