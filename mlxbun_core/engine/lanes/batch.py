"""The batch lane: continuous batching on mlx-lm's ``BatchGenerator``.

Each ``step`` admits waiting jobs that fit (row cap, memory), runs one
BatchGenerator turn (a decode step for every generating row, then one prefill
chunk for rows still reading their prompt, so a long prompt never freezes the
running streams; the engine's pacer caps the chunk so a cancel, checked at the
start of every step, lands within about a second), routes each row's token to its session, and removes finished
or cancelled rows. Per-row samplers, logits processors (penalties, logit_bias,
grammar masks) and logprobs are BatchGenerator's own. Rows start from the
longest cached prefix and publish their KV to the prefix cache when they end.

A job alone in the lane decodes outside the BatchGenerator (``solo.py``: a lone
stream at mlx-lm's single-sequence speed) and joins the batch, KV and all, as soon
as another job of its adapter set arrives; a batch that drains to one decoding row
hands that row back out the same way.

A batch runs one LoRA adapter set (the base model is the empty set). A fresh
batch takes the oldest waiting job's set and every waiting job with the same set;
while it runs, newcomers with that set join until a job with another set is
oldest in line, then the batch drains and that set goes next (bounded waiting).
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Optional

from ... import kvquant
from ...adapters.manager import NO_ADAPTERS
from ...metrics.engine import StepTally
from ..job import GenerationJob
from ..prompt_cache import PrefixCache, trimmable
from .pace import FixedChunk, PrefillPacer
from .serial import fresh_random_state
from .solo import Solo

log = logging.getLogger("mlxbun.engine")

NO_LIMIT = 1 << 30
PREFILL_ROWS = 8  # prompts prefilled together in one chunk
PREFILL_TOKENS = 2048  # tokens of one chunk (all its rows) while a few rows are decoding
PREFILL_TOKENS_MAX = 8192  # ... growing with the prompts waiting, up to this
IDLE_STEP = 2048  # tokens per row and chunk when nothing decodes (mlx-lm's own step)


class _Row:
    __slots__ = ("job", "prompt", "snapshot")

    def __init__(self, job: GenerationJob, snapshot: bool):
        self.job = job
        self.prompt = job.request.prompt_tokens
        self.snapshot = snapshot  # publish the prompt-boundary KV (caches that cannot rewind)


class BatchLane:
    name = "batched"

    def __init__(self, model, cap: int, prefix: Optional[PrefixCache] = None, admission=None,
                 prefill_tokens: int = PREFILL_TOKENS, adapters=None,
                 pacer: Optional[PrefillPacer] = None, kv=kvquant.OFF):
        self.kv = kv  # the KV scheme: every forward pass quantizes its cache after it runs
        self.model = kvquant.quantizing(model, kv)
        self.adapters = adapters  # the engine's AdapterManager (None: no LoRA support)
        self._set = NO_ADAPTERS  # the adapter set of the running rows
        self.cap = cap
        self.prefix = prefix
        self.admission = admission
        self.prefill_tokens = prefill_tokens  # per prefill chunk while other rows decode
        self._gen = None  # the BatchGenerator, made on the worker thread at first use
        self._queue: collections.deque[GenerationJob] = collections.deque()
        self._rows: dict[int, _Row] = {}
        self._solo: Optional[Solo] = None  # a lone job decoding outside the batch
        self.pacer = pacer or PrefillPacer()  # prompt tokens per chunk, from measured speed
        self.solo_prefill: Optional[int] = None  # pins the lone job's chunk (tests)
        self.steps = StepTally()  # decode steps and the rows they carried (/metrics)

    # -- the Lane protocol ---------------------------------------------------------
    def accepts(self, job: GenerationJob) -> bool:
        req = job.request
        # a draft, prompt embeddings, media or a seed (reproducible only alone) take the
        # serial lane
        return (job.draft is None and req.input_embeddings is None and req.media is None
                and req.sampling.seed is None)

    def add(self, job: GenerationJob) -> None:
        self._queue.append(job)

    @property
    def active(self) -> int:
        return len(self._rows) + (self._solo is not None)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    exclusive = False

    @property
    def alone(self) -> bool:
        """Whether a lone job is decoding outside the BatchGenerator."""
        return self._solo is not None

    def step(self) -> None:
        self._drop_cancelled()
        if self._solo is not None and any(j.adapters.key == self._set.key for j in self._queue):
            self._join_batch()  # company arrived: the lone job moves into the batch
        self._admit()
        if not self._rows and self._solo is None:
            return
        if self.adapters is not None:  # the serial lane may have run another set meanwhile
            self.adapters.activate(self._set)
        if self._solo is not None:
            return self._solo_step()
        try:
            gen = self._generator()
            asked = self._size_prefill(gen)
            prompt_responses, responses = self._next(gen, asked)
        except Exception as exc:  # a failed forward fails every row; the lane starts afresh
            log.exception("batch step failed")
            return self._fail_all(str(exc))
        for r in prompt_responses:
            if r.end_of_segment and not r.end_of_prompt and self._rows[r.uid].snapshot:
                self._publish_boundary(r.uid)
        self.steps.add(len(responses))
        for r in responses:
            self._route(r)
        if len(self._rows) == 1 and not self._queue:
            self._leave_batch()

    def close(self, error: str = "server shutting down", reason: str = "cancelled") -> None:
        if self._solo is not None:
            self._end_solo().close(reason, error)
        self._fail_all(error, reason=reason)
        while self._queue:
            self._queue.popleft().close(reason, error)
        if self._gen is not None:
            self._gen.close()
            self._gen = None

    # -- admission -----------------------------------------------------------------
    def _admit(self) -> None:
        if self._solo is not None:
            return  # it joins the batch first (step), or runs on alone
        fresh = not self._rows
        if fresh and self._queue:
            self._set = self._queue[0].adapters
            if sum(j.adapters.key == self._set.key for j in self._queue) == 1:
                return self._start_solo(self._queue.popleft())
        i = 0
        while i < len(self._queue) and len(self._rows) < self.cap:
            job = self._queue[i]
            if job.adapters.key != self._set.key:
                if not fresh:
                    return  # another adapter set waits: let this batch drain
                i += 1  # a fresh batch gathers every waiting job of its set
                continue
            if self.admission is not None:
                if not self.admission.fits(job) and self._rows:
                    return  # wait for a row to finish and free its KV
                # alone it must run: its limit was bounded to the budget at start
                self.admission.reserve(job)
            del self._queue[i]
            self._insert(job)

    def _forget(self, uid: int) -> _Row:
        row = self._rows.pop(uid)
        if self.admission is not None:
            self.admission.release(row.job)
        return row

    def _lookup(self, job: GenerationJob):
        """``(cache, n)``: the longest cached prefix of the job's prompt (admits the job)."""
        job.mark_started(self.name)
        cache, n, t0 = None, 0, time.perf_counter()
        if job.cache_namespace is not None and self.prefix is not None:
            cache, n = self.prefix.lookup(job.cache_namespace, job.request.prompt_tokens)
        job.session.phases["cache_lookup_s"] = time.perf_counter() - t0
        job.admitted(n)
        return cache, n

    def _insert(self, job: GenerationJob) -> None:
        cache, n = self._lookup(job)
        rest = job.request.prompt_tokens[n:]
        self._add_row(job, cache, job.request.prompt_tokens[:n],
                      [rest[:-1], rest[-1:]] if len(rest) > 1 else [rest])

    def _add_row(self, job: GenerationJob, cache, held: list, segments: list) -> None:
        """Start a row whose KV ``cache`` holds the tokens ``held``; ``segments`` are fed
        next (a row snapshots its prompt boundary when the last segment is its own)."""
        left = job.limit - job.session.usage.completion_tokens if job.limit else NO_LIMIT
        cache = kvquant.for_batch(cache, self.kv, self.model)
        (uid,) = self._generator().insert_segments(
            [segments], max_tokens=[left], caches=[cache] if cache is not None else None,
            all_tokens=[held], samplers=[job.request.sampler],
            logits_processors=[job.request.processors])
        snapshot = job.cache_namespace is not None and self.prefix is not None \
            and len(segments) > 1 and not self._rewindable()
        self._rows[uid] = _Row(job, snapshot)

    # -- a job alone ---------------------------------------------------------------
    def _start_solo(self, job: GenerationJob) -> None:
        if self.admission is not None:
            self.admission.reserve(job)  # alone it must run: bounded to the budget at start
        cache, n = self._lookup(job)
        if cache is None:
            from mlx_lm.models.cache import make_prompt_cache

            cache = make_prompt_cache(self.model)
        self._solo = Solo(self.model, job, cache, n, self._solo_pacer())

    def _solo_step(self) -> None:
        solo = self._solo
        job = solo.job
        try:
            out = solo.step()
        except Exception as exc:  # report to the request, keep serving others
            log.exception("generation failed")
            fresh_random_state()  # a failure inside a compiled sampler can leave it unusable
            self._end_solo()
            return job.close("error", str(exc))
        if out is None:  # a prefill chunk
            if not solo.prefilling and job.cache_namespace is not None and self.prefix is not None:
                boundary = solo.boundary()
                if boundary is not None:
                    self.prefix.store(job.cache_namespace, list(solo.fed), boundary,
                                      boundary=True)
            return
        self.steps.add(1)
        self._deliver(job, *out)
        if job.finished:
            self._publish(self._end_solo(), solo.fed, solo.cache)

    def _join_batch(self) -> None:
        solo = self._solo
        pending, segments = solo.handoff()
        job = solo.job
        if pending is not None:
            self.steps.add(1)  # the token its last lone step computed
            self._deliver(job, *pending)
            if job.finished:
                return self._publish(self._end_solo(), solo.fed, solo.cache)
            segments = [[pending[0]]]
        self._solo = None  # the row keeps its admission reservation
        self._add_row(job, solo.cache if solo.fed else None, solo.fed, segments)

    def _leave_batch(self) -> None:
        """The last decoding row goes on alone, with the token the batch already sampled
        for it (read from the generator's state; left in the batch if that changes)."""
        gen = self._gen
        try:
            batch = gen._generation_batch
            if len(batch) != 1 or len(gen._prompt_batch) or gen._unprocessed_sequences \
                    or batch._next_tokens is None:
                return
            uid, pending = batch.uids[0], (batch._next_tokens, batch._next_logprobs[0])
        except (AttributeError, IndexError, TypeError):  # another mlx-lm: stay batched
            return
        cache, fed = gen.remove([uid], return_prompt_caches=True)[uid]
        job = self._rows.pop(uid).job  # it keeps its admission reservation
        self._solo = Solo.resume(self.model, job, cache, fed, pending, self._solo_pacer())

    def _solo_pacer(self) -> PrefillPacer:
        return self.pacer if self.solo_prefill is None else FixedChunk(self.solo_prefill)

    def _end_solo(self) -> GenerationJob:
        job, self._solo = self._solo.job, None
        if self.admission is not None:
            self.admission.release(job)
        return job

    def _rewindable(self) -> bool:
        if not hasattr(self, "_can_trim"):
            from mlx_lm.models.cache import make_prompt_cache

            self._can_trim = trimmable(make_prompt_cache(self.model))
        return self._can_trim

    def _size_prefill(self, gen) -> int:
        """Chunk size for this step; returns the chunk's token budget (0: no prompt is
        being read). While nothing decodes: mlx-lm's own step per prompt (time to first
        token is all that matters). While streams run: a token budget shared by the
        prompt rows, so no stream freezes for long; it grows with the number of prompts
        waiting, whose clients are all waiting for a first token. Either way no longer
        than the pacer allows, so a cancel lands within about one chunk."""
        prefilling = sum(1 for row in self._rows.values() if row.job.session.t_first is None)
        decoding = len(self._rows) - prefilling
        rows = max(1, min(prefilling, PREFILL_ROWS))
        if decoding == 0:
            budget = IDLE_STEP * rows
        else:
            budget = min(PREFILL_TOKENS_MAX, max(self.prefill_tokens, 512 * prefilling))
        budget = self.pacer.chunk(budget)
        gen.prefill_step_size = gen._prompt_batch.prefill_step_size = max(1, budget // rows)
        return budget if prefilling else 0

    def _next(self, gen, asked: int):
        """One BatchGenerator turn; a turn that reads prompts feeds the pacer."""
        stats = getattr(gen, "stats", None)
        if not asked or stats is None:
            return gen.next()
        with stats() as measured:
            out = gen.next()
        self.pacer.record(measured.prompt_tokens, measured.prompt_time, asked)
        return out

    def _generator(self):
        if self._gen is None:
            from mlx_lm.generate import BatchGenerator

            # prefill at most 8 prompts per chunk: 32 arrivals then start in waves
            # instead of all waiting for one huge chunk (the median TTFT halves)
            self._gen = BatchGenerator(self.model, completion_batch_size=self.cap,
                                       prefill_batch_size=min(self.cap, PREFILL_ROWS),
                                       prefill_step_size=IDLE_STEP)
        return self._gen

    # -- tokens out ----------------------------------------------------------------
    def _route(self, r) -> None:
        row = self._rows.get(r.uid)
        if row is None:
            return
        job = row.job
        if not job.finished:
            self._deliver(job, r.token, r.logprobs)
        if r.finish_reason is not None:  # the generator already dropped the row
            self._forget(r.uid)
            if not job.finished:
                job.close("length")
            self._publish(job, r.all_tokens, r.prompt_cache)
        elif job.finished:
            self._remove(r.uid, publish=True)

    @staticmethod
    def _deliver(job: GenerationJob, token: int, logprobs) -> None:
        if job.session.t_first is None:
            job.session.phases["prefill_s"] = time.perf_counter() - job.started
        job.deliver(token, logprobs)

    def _remove(self, uid: int, publish: bool) -> None:
        row = self._forget(uid)
        want = publish and row.job.cache_namespace is not None and self.prefix is not None
        caches = self._gen.remove([uid], return_prompt_caches=want)
        if want and uid in caches:
            cache, tokens = caches[uid]
            self._publish(row.job, tokens, cache)

    def _publish(self, job: GenerationJob, tokens, cache) -> None:
        if job.cache_namespace is not None and self.prefix is not None and tokens and cache:
            self.prefix.store(job.cache_namespace, list(tokens), cache)

    def _publish_boundary(self, uid: int) -> None:
        row = self._rows[uid]
        got = self._gen.extract_cache([uid]).get(uid)
        if got is not None:
            cache, tokens = got
            self.prefix.store(row.job.cache_namespace, list(tokens), cache, boundary=True)

    def _drop_cancelled(self) -> None:
        if self._solo is not None and self._solo.job.cancelled.is_set():
            self._end_solo().close("cancelled")
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
