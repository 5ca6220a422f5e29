"""The batch lane: continuous batching on mlx-lm's ``BatchGenerator``.

Each ``step`` admits waiting jobs that fit (row cap, memory), runs one
BatchGenerator turn (a decode step for every generating row, then one prefill
chunk for rows still reading their prompt, sized in ``prefill.py`` so a long prompt
never freezes the running streams and a cancel, checked at the start of every step,
lands within about a second), routes each row's token to its session, and removes
finished or cancelled rows. Per-row samplers, logits processors (penalties, logit_bias,
grammar masks) and logprobs are BatchGenerator's own. Rows start from the
longest cached prefix and publish their KV to the prefix cache when they end.

A job alone in the lane decodes outside the BatchGenerator (``solo.py``: a lone
stream at mlx-lm's single-sequence speed, kept in the lane's ``SoloSlot``) and joins
the batch, KV and all, as soon as another job of its adapter set arrives; a batch that
drains to one decoding row hands that row back out the same way.

LoRA adapter sets mix in one batch: each forward pass routes its rows to their own
sets (``adapters/rows.py``; the base model is the empty set). Sets that cannot run
per row (``AdapterManager.group``) run one per batch: a fresh batch takes the oldest
waiting job's group and every waiting job of that group; while it runs, newcomers of
the group join until a job of another group is oldest in line, then the batch drains
and that group goes next (bounded waiting).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ... import kvquant
from ...adapters.sets import AdapterSet
from ..fill import rows as fill_rows
from ..job import GenerationJob
from ..prompt_cache import PrefixCache, trimmable
from ..speculate import mtp_prompt
from ..speculate.batch import BatchSpeculator
from ..speculate.config import MTP
from ..speculate.mtp_batch import MtpBatch, supported
from .pace import FixedChunk, PrefillPacer
from .prefill import PREFILL_TOKENS, make_generator, paced_turn, size_chunk
from .slot import BatchRow, SoloSlot, deliver
from .tally import StepTally

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.generate import BatchGenerator, GenerationBatch

    from ...adapters import AdapterManager
    from ...contract import TokenPredictor
    from ..admission import Admission

log = logging.getLogger("mlxbun.engine")

NO_LIMIT = 1 << 30


class BatchLane:
    name = "batched"

    def __init__(self, model: nn.Module, cap: int, prefix: PrefixCache | None = None,
                 admission: Admission | None = None, prefill_tokens: int = PREFILL_TOKENS,
                 adapters: AdapterManager | None = None, pacer: PrefillPacer | None = None,
                 kv: kvquant.KVScheme = kvquant.OFF,
                 predictor: TokenPredictor | None = None) -> None:
        self.kv = kv  # the KV scheme: every forward pass quantizes its cache after it runs
        self.model = kvquant.quantizing(model, kv)
        self.adapters = adapters  # the engine's AdapterManager (None: no LoRA support)
        self._group = ""  # the adapter group of the running rows (AdapterManager.group)
        self.cap = cap
        self.prefix = prefix
        self.admission = admission
        self.prefill_tokens = prefill_tokens  # per prefill chunk while other rows decode
        self._gen: BatchGenerator | None = None  # made on the worker thread at first use
        self._queue: collections.deque[GenerationJob] = collections.deque()
        self._rows: dict[int, BatchRow] = {}
        self.steps = StepTally()  # decode steps and the rows they carried (/metrics)
        # a lone job decoding outside the batch
        self._solo = SoloSlot(self.model, admission, self._publish, self._uses_prefix,
                              self.steps)
        self.pacer = pacer or PrefillPacer()  # prompt tokens per chunk, from measured speed
        self.solo_prefill: int | None = None  # pins the lone job's chunk (tests)
        self.spec = BatchSpeculator()  # rows' prompt lookup (speculate/batch.py)
        # rows drafting with the model's MTP head (speculate/mtp_batch.py)
        self.mtp = MtpBatch(predictor) if predictor is not None else None
        self._solo.predictor = predictor  # a lone MTP job drafts there too (solo_mtp.py)

    # -- the Lane protocol ---------------------------------------------------------
    def accepts(self, job: GenerationJob) -> bool:
        req = job.request
        # a draft, prompt embeddings, media, a seed (reproducible only alone), a scored
        # prompt, no completion budget (echo) or MTP speculation the batch cannot run
        # take the serial lane
        return (job.draft is None and req.input_embeddings is None and req.media is None
                and req.sampling.seed is None and not req.score_prompt and job.limit != 0
                and (not self._wants_mtp(job) or self._runs_mtp(job)))

    def _wants_mtp(self, job: GenerationJob) -> bool:
        return job.spec is not None and job.spec.kind == MTP

    def _runs_mtp(self, job: GenerationJob) -> bool:
        """Whether ``job``'s MTP speculation runs here: the head's loop calls the model
        unwrapped (no KV scheme); logits processors see a window per row only on the
        serial lane; the cache must be plain KV or recurrent state (``supported``)."""
        if self.mtp is None or self.kv is not kvquant.OFF or job.request.processors:
            return False
        if not hasattr(self, "_mtp_caches"):
            from mlx_lm.models.cache import make_prompt_cache

            self._mtp_caches = supported(make_prompt_cache(self.model))
        return self._mtp_caches

    def add(self, job: GenerationJob) -> None:
        self._queue.append(job)

    @property
    def active(self) -> int:
        return len(self._rows) + (self._solo.job is not None)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    exclusive = False

    @property
    def alone(self) -> bool:
        """Whether a lone job is decoding outside the BatchGenerator."""
        return self._solo.job is not None

    def step(self) -> None:
        self._drop_cancelled()
        if self.alone and any(self._group_of(j) == self._group for j in self._queue):
            head = self._solo.head_cache()  # a lone MTP job's head goes with it
            moving = self._solo.join()  # company arrived: the lone job moves into the batch
            if moving is not None:  # (None: the token it had sampled already ended it)
                uid = self._add_row(*moving)
                if head is not None and self.mtp is not None and uid in self.mtp.rows:
                    self.mtp.rows[uid].head_cache = head
        self._admit()
        if not self._rows and not self.alone:
            return
        lone = self._solo.job
        if lone is not None:
            if self.adapters is not None:  # the serial lane may have run another set meanwhile
                self.adapters.activate(lone.adapters)
            return self._solo.step()
        try:
            gen = self._generator()
            asked = size_chunk(gen, self.pacer, [row.job for row in self._rows.values()],
                               self.prefill_tokens)
            spec = self.mtp if self.mtp is not None and self.mtp.wants(gen) else self.spec
            with spec.turn(gen, None if self.adapters is None else self._route_rows):
                prompt_responses, responses = paced_turn(gen, self.pacer, asked)
        except Exception as exc:  # a failed forward fails every row; the lane starts afresh
            log.exception("batch step failed")
            return self._fail_all(str(exc))
        for r in prompt_responses:
            if r.end_of_segment and not r.end_of_prompt and self._rows[r.uid].snapshot:
                self._publish_boundary(r.uid)
        uids = {r.uid for r in responses}
        self.steps.add(len(uids))
        self.spec.stepped(uids)
        if self.mtp is not None:
            self.mtp.stepped(uids)
        for r in responses:
            self._route(r)
        if len(self._rows) == 1 and not self._queue:  # the last row goes on alone
            self._solo.leave(gen, self._rows, self._solo_pacer(), self._mtp_state)
            self.spec.retain(self._rows)
            if self.mtp is not None:
                self.mtp.retain(self._rows)

    def close(self, error: str = "server shutting down", reason: str = "cancelled") -> None:
        self._solo.close(reason, error)
        self._fail_all(error, reason=reason)
        while self._queue:
            self._queue.popleft().close(reason, error)
        if self._gen is not None:
            self._gen.close()
            self._gen = None

    # -- admission -----------------------------------------------------------------
    def _admit(self) -> None:
        if self.alone:
            return  # it joins the batch first (step), or runs on alone
        fresh = not self._rows
        if fresh and self._queue:
            self._group = self._group_of(self._queue[0])
            if sum(self._group_of(j) == self._group for j in self._queue) == 1:
                job = self._queue.popleft()  # alone it must run: bounded to the budget at start
                return self._solo.start(job, *self._take(job), self._solo_pacer())
        i = 0
        while i < len(self._queue) and len(self._rows) < self.cap:
            job = self._queue[i]
            if self._group_of(job) != self._group:
                if not fresh:
                    return  # another adapter group waits: let this batch drain
                i += 1  # a fresh batch gathers every waiting job of its set
                continue
            if self.admission is not None and not self.admission.fits(job) and self._rows:
                return  # wait for a row to finish and free its KV
            # (with no rows it must run: its limit was bounded to the budget at start)
            del self._queue[i]
            self._insert(job)

    def _group_of(self, job: GenerationJob) -> str:
        """The batch ``job`` may join (its adapter set's group)."""
        return "" if self.adapters is None else self.adapters.group(job.adapters)

    def _forget(self, uid: int) -> BatchRow:
        self.spec.drop(uid)
        if self.mtp is not None:
            self.mtp.drop(uid)
        row = self._rows.pop(uid)
        fill_rows.forget(self._gen, uid)
        if self.admission is not None:
            self.admission.release(row.job)
        return row

    def _take(self, job: GenerationJob) -> tuple[list[Any] | None, int]:
        """Admit ``job``: reserve its KV, then ``(cache, n)``, the longest cached prefix
        of its prompt."""
        if self.admission is not None:
            self.admission.reserve(job)
        job.mark_started(self.name)
        if self._wants_mtp(job):
            job.session.usage.lane = f"{self.name}+spec"
        cache: list[Any] | None = None
        n, t0 = 0, time.perf_counter()
        if self._uses_prefix(job) and self.prefix is not None:
            cache, n = self.prefix.lookup(job.cache_namespace, job.request.prompt_tokens)
        job.session.phases["cache_lookup_s"] = time.perf_counter() - t0
        job.admitted(n)
        return cache, n

    def _insert(self, job: GenerationJob) -> None:
        cache, n = self._take(job)
        rest = job.request.prompt_tokens[n:]
        self._add_row(job, cache, job.request.prompt_tokens[:n],
                      [rest[:-1], rest[-1:]] if len(rest) > 1 else [rest])

    def _add_row(self, job: GenerationJob, cache: list[Any] | None, held: list[int],
                 segments: list[list[int]]) -> int:
        """Start a row whose KV ``cache`` holds the tokens ``held``; ``segments`` are fed
        next (a row snapshots its prompt boundary when the last segment is its own); its uid."""
        left = job.limit - job.session.usage.completion_tokens if job.limit else NO_LIMIT
        cache = kvquant.for_batch(cache, self.kv, self.model)
        uid: int
        (uid,) = self._generator().insert_segments(
            [segments], max_tokens=[left], caches=[cache] if cache is not None else None,
            all_tokens=[held],
            samplers=[job.request.sampler],  # type: ignore[list-item]  # mlx-lm: None is greedy
            logits_processors=[job.request.processors])
        snapshot = self._uses_prefix(job) and len(segments) > 1 and not self._rewindable()
        self._rows[uid] = BatchRow(job, snapshot)
        fill_rows.watch(self._generator(), uid, job.fill)
        if job.spec is not None:
            self.spec.tally = job.spec_tally
        if self._wants_mtp(job) and self.mtp is not None:
            assert job.spec is not None  # (wants_mtp)
            self.mtp.tally = job.spec_tally
            self.mtp.add(uid, job.spec.num_draft_tokens or self.mtp.predictor.num_draft_tokens,
                         job.session.usage, [*held, *(t for seg in segments for t in seg)],
                         len(held))
        elif job.spec is not None:
            self.spec.add(uid, job.spec, [*held, *(t for seg in segments for t in seg)],
                          job.session.usage)
        return uid

    def _mtp_state(self, uid: int) -> Any:
        """An MTP row's state for the lone-stream path (None: not an MTP row)."""
        return self.mtp.leaving(uid) if self.mtp is not None and uid in self.mtp.rows else None

    def _solo_pacer(self) -> PrefillPacer:
        return self.pacer if self.solo_prefill is None else FixedChunk(self.solo_prefill)

    def _rewindable(self) -> bool:
        if not hasattr(self, "_can_trim"):
            from mlx_lm.models.cache import make_prompt_cache

            self._can_trim = trimmable(make_prompt_cache(self.model))
        return self._can_trim

    def _generator(self) -> BatchGenerator:
        if self._gen is None:
            gen = make_generator(self.model, self.cap)
            fill_rows.install(gen)  # rows with a fill session feed forced runs
            if self.mtp is not None:  # MTP rows' heads read their prompts' hidden states
                mtp_prompt.install(gen, self.mtp)
                self.mtp.fresh()  # (a new generator numbers its rows from 0 again)
            self._gen = gen
            if self.adapters is not None:  # after install: routes the fill step's passes too
                self.adapters.attach(gen, self._rows_sets)
        return self._gen

    def _route_rows(self, uids: list[int]) -> None:
        """Route a pass the lane runs itself (a speculative verify) by its rows' sets."""
        if self.adapters is not None:
            self.adapters.route(self._rows_sets(uids), self._rows_sets)

    def _rows_sets(self, uids: list[int] | None = None) -> list[AdapterSet]:
        """The adapter sets of the rows ``uids`` (None: every row), for routing a pass."""
        rows = self._rows
        if uids is None:
            return [row.job.adapters for row in rows.values()]
        return [rows[uid].job.adapters for uid in uids]

    # -- tokens out ----------------------------------------------------------------
    def _route(self, r: GenerationBatch.Response) -> None:
        row = self._rows.get(r.uid)
        if row is None:
            return
        job = row.job
        self.spec.observe(r.uid, r.token)
        if not job.finished:
            deliver(job, r.token, r.logprobs, fill_rows.run_of(self._generator(), r.uid))
        if r.finish_reason is not None:  # the generator already dropped the row
            self._forget(r.uid)
            if not job.finished:
                job.close("length")
            self._publish(job, r.all_tokens, r.prompt_cache)
        elif job.finished:
            self._remove(r.uid, publish=True)

    def _remove(self, uid: int, publish: bool) -> None:
        row = self._forget(uid)
        want = publish and self._uses_prefix(row.job)
        caches = self._generator().remove([uid], return_prompt_caches=want)
        if want and uid in caches:
            cache, tokens = caches[uid]
            self._publish(row.job, tokens, cache)

    # -- prefix publishing ----------------------------------------------------------
    def _uses_prefix(self, job: GenerationJob) -> bool:
        """Whether ``job`` starts from, and publishes to, the prefix cache."""
        return job.cache_namespace is not None and self.prefix is not None

    def _publish(self, job: GenerationJob, tokens: Sequence[int] | None,
                 cache: list[Any] | None, boundary: bool = False) -> None:
        """Store ``job``'s KV ``cache`` of ``tokens`` (``boundary``: a snapshot at the
        prompt's end, for caches that cannot rewind)."""
        if self._uses_prefix(job) and self.prefix is not None and tokens and cache:
            self.prefix.store(job.cache_namespace, list(tokens), cache, boundary=boundary)

    def _publish_boundary(self, uid: int) -> None:
        got = self._generator().extract_cache([uid]).get(uid)
        if got is not None:
            cache, tokens = got
            self._publish(self._rows[uid].job, tokens, cache, boundary=True)

    def _drop_cancelled(self) -> None:
        self._solo.drop_cancelled()
        for uid in [u for u, row in self._rows.items() if row.job.cancelled.is_set()]:
            job = self._rows[uid].job
            self._remove(uid, publish=False)
            job.close("cancelled")
        if any(j.cancelled.is_set() for j in self._queue):
            for job in [j for j in self._queue if j.cancelled.is_set()]:
                self._queue.remove(job)
                job.close("cancelled")

    def _fail_all(self, error: str, reason: str = "error") -> None:
        for uid in list(self._rows):
            self._forget(uid).job.close(reason, error)
        if self._gen is not None and reason == "error":
            self._gen.close()
            self._gen = None
