"""The engine facade the surfaces talk to: ``start`` a typed request, read events.

Surfaces parse their body into a :class:`~mlxbun_core.engine.request.ChatRequest`
or ``CompletionRequest`` and call :meth:`Engine.start`; they get a
:class:`Generation` handle and never see jobs, lanes or the worker. What a surface
may use of :class:`Engine` (``register(app, engine: Engine)``): ``model``, ``hooks``,
``defaults`` and ``max_tokens`` (what a parser fills in), ``parse_chat`` /
``parse_completion``, ``start``, ``count_prompt_tokens``, ``embed``, ``rerank``,
``adapters``, ``draining``, ``close`` and the read-only figures for ``/stats`` and ``/v1/models``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..adapters import AdapterManager, AdapterSet
from ..contract import DraftSource, TokenPredictor
from ..errors import APIError, BadRequest, Overloaded, Unavailable
from ..events import Finish, Retry
from ..media import parts as media_parts
from ..model import LoadedModel, LoadOptions
from . import engine_stats, gen_checkpoint, warmup, wide_quant
from . import rerank as reranking
from .admission import Admission, default_batch, drafts_with_head, head_cost
from .batch.journal import Journal
from .completion_request import parse_completion
from .durable import open_tier
from .fill import FillPolicy
from .generation import Generation as Generation  # (surfaces import it from here)
from .job import EventSink, GenerationJob, may_speculate
from .lanes.batch import BatchLane
from .lanes.pace import PrefillPacer
from .lanes.serial import SerialLane
from .memory import DEVICE_FAULT, Governor, MemoryConfig
from .prepare import Prepared, media_pipeline, prepare
from .prompt_cache import PrefixCache
from .request import ChatRequest, CompletionRequest, GenerationInput, parse_chat
from .session import GenerationRequest
from .speculate import MTP, SpecConfig, SpecTally, SpecUnavailable, check_mtp
from .speculate import resolve as resolve_spec
from .worker import ModelWorker

if TYPE_CHECKING:
    import numpy as np

    from ..kvstore import SsdConfig
    from ..plugins import ModelHooks
    from ..speech import TranscribeOptions, Transcription

log = logging.getLogger("mlxbun.engine")


DEFAULT_PROMPT_CACHE_BYTES = 8 << 30


class Engine:
    """One loaded model, its worker thread and lanes.

    ``batch`` caps the rows decoded together (None: sized from the device and the
    model, see :func:`~mlxbun_core.library.fit.batch_plan`; 1 pins the serial lane; a
    mounted draft model always decodes serially); ``prompt_cache_bytes`` caps the
    prefix KV cache (0 turns it off); ``kv_quant`` (``off``, ``4``, ``8``, ``config``,
    ``turbo[:kXvY]``) quantizes the KV cache.
    """

    def __init__(self, model: LoadedModel, *, worker: ModelWorker | None = None,
                 defaults: dict[str, Any] | None = None, max_tokens: int | None = None,
                 draft: DraftSource | None = None, batch: int | None = None,
                 prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
                 memory_budget_bytes: int | None = None, kv_quant: object = "off",
                 kv_budget_bytes: int | None = None,
                 ssd: SsdConfig | None = None, fill: str | None = None,
                 speculation: SpecConfig | None = None,
                 predictor: TokenPredictor | None = None, memory: MemoryConfig | None = None):
        self.model = model
        # memory measured, pressure met, faults injected (tests): the run configuration's
        # faults (MLXBUN_FAULT_*) unless ``memory`` says
        self.memory = Governor(memory or MemoryConfig.from_config())
        self.memory.on_lost = self._device_lost
        self.memory.lockstep = isinstance(getattr(model.model, "journal", None), Journal)
        # the checkpoint's multi-token-prediction head (--draft-kind mtp / draft_kind "mtp")
        self.predictor = predictor
        if (speculation is None and draft is None and not self.memory.lockstep
                and getattr(predictor, "default_on", False)):
            speculation = SpecConfig(MTP, 0)  # a family whose head drafts unasked (GLM's --mtp)
        if speculation is not None and speculation.kind == MTP and predictor is None:
            raise SpecUnavailable(f"--draft-kind mtp: {model.id} has no multi-token-prediction "
                                  "head (no plugin offered one for this checkpoint)")
        self.fill = FillPolicy.resolve(fill)  # forced-token fill (MLXBUN_FILL / --fill)
        self.draft = draft  # every request then decodes speculatively
        # prompt-lookup speculation by default (--draft-kind ngram); requests may override
        self.speculation = speculation
        self.spec_tally = SpecTally()
        self.worker = worker or ModelWorker()
        if predictor is not None and speculation is not None and speculation.kind == MTP:
            self.worker.run_sync(predictor.make_cache)  # the head's weights now, not mid-reply
        tier = open_tier(ssd, prompt_cache_bytes, model, lambda: self.adapters,
                         busy=lambda: not self.idle)
        self.prefix = PrefixCache(prompt_cache_bytes, tier=tier, post=self.worker.post)
        self.checkpoints = gen_checkpoint.open_store(ssd, tier)  # --generation-checkpoint
        self.kv = warmup.kv_scheme(kv_quant, model)  # (config: the model's kv_config.json)
        self.unpacked = warmup.unpack_quantized(model, self.worker)  # (wide_quant.py)
        self.admission = Admission(model, memory_budget_bytes, kv_bits=self.kv.bill_bits,
                                   head=head_cost(predictor, self.kv.enabled))
        warmup.check_kv(model, self.kv, self.admission, self.worker)
        if self.unpacked:
            self.admission.unpacked = (self.unpacked, wide_quant.widest_bytes(model.model))
        self._size_batch(batch, draft)
        self.adapters = AdapterManager(model, call=self.worker.call,
                                       on_bytes=self.admission.set_adapter_bytes)
        self.admission.set_kv_budget(kv_budget_bytes)  # --kv-budget (None: off)
        self.pacer = PrefillPacer()  # prompt tokens per prefill chunk, every lane
        self.warmup: dict[str, Any] = {}  # what start-up warmed, in how long (warmup.py)
        self.prefix.prefill_rate = lambda: self.pacer.rate  # an SSD restore must beat it
        self.prefix.prefill_measured = lambda: self.pacer.rate if self.pacer.measured else None
        if not self.worker.lanes:
            self._start_lanes()
        warmup.seed_ssd_rates(model, self.prefix, self.worker, self.pacer)
        # generation_config.json values, then operator flags on top; requests win over both
        self.defaults = {**model.generation_defaults, **(defaults or {})}
        # chat_template_kwargs a request gets unless it sends its own (mlxbun.yaml's models:)
        self.template_defaults: dict[str, Any] = {}
        self.max_tokens = max_tokens
        self.started_at = int(time.time())
        self._prepare_lock = threading.Lock()
        self.requests = 0
        self.completed = 0
        self.draining = False  # set on SIGINT/SIGTERM: new work gets a 503
        self.aborted = False  # set by abort(): nothing more is queued
        # why the engine can serve nothing more (a rank of a --distributed group was lost,
        # the device failed): new work gets a 503 engine_unavailable
        self.unavailable: str | None = None
        self.unavailable_retry: Retry | None = None  # (the device: it restarts)
        # told once the device failed for good (serve: drain what it can, exit non-zero)
        self.on_fatal: Callable[[str], None] | None = None
        # told every generation's Finish as it ends: the /metrics recorder (metrics.for_engine)
        self.on_finish: Callable[[Finish], None] | None = None
        self.prom_metrics: object | None = None  # its /metrics series (metrics.for_engine)
        self.starting = 0  # requests being prepared (not yet queued)

    def _size_batch(self, batch: int | None, draft: DraftSource | None) -> None:
        """The batch lane's row cap: ``--batch``, else planned from the memory room; one
        row with a draft model (it runs on the serial lane)."""
        speech = self.model.kind == "speech"  # no KV cache: the serial lane only
        no_rows = batch or draft is not None or speech
        self.batch_plan = None if no_rows else default_batch(self.model, self.admission)
        self.batch_source = ("draft model" if draft is not None else
                             "--batch" if batch else "auto")
        plan_rows = self.batch_plan.rows if self.batch_plan is not None else 1
        self.batch = 1 if draft is not None or speech else max(1, batch or plan_rows)

    def _start_lanes(self) -> None:
        """The worker's lanes, sharing one prefill pacer, warmed now on the worker."""
        model = self.model
        serial = SerialLane(model.model, self.prefix, self.admission, adapters=self.adapters,
                            pacer=self.pacer, kv=self.kv, predictor=self.predictor,
                            governor=self.memory)
        self.worker.lanes = ([BatchLane(model.model, self.batch, self.prefix, self.admission,
                                        adapters=self.adapters, pacer=self.pacer, kv=self.kv,
                                        predictor=self.predictor, governor=self.memory),
                              serial]
                             if self.batch > 1 else [serial])
        self.warmup = warmup.warm(model, self.worker, self.pacer)
        log.info("batch: %d rows (%s)", self.batch, self.batch_source if self.batch_plan is None
                 else f"auto: {self.batch_plan.reason}")

    @classmethod
    def load(cls, name: str | None, options: LoadOptions | None = None, *, progress: bool = True,
             **kw: Any) -> Engine:
        """Load ``name`` on a fresh worker thread (where it must live) and wrap it."""
        from .. import loader

        opts = options or LoadOptions()
        t0 = time.monotonic()
        worker = ModelWorker()
        model = worker.run_sync(lambda: loader.load(name, opts, progress=progress))
        draft = worker.run_sync(lambda: model.hooks.draft_source(model=model, options=opts))
        if model.kind == "generate" and "predictor" not in kw:
            kw["predictor"] = worker.run_sync(lambda: model.hooks.token_predictor(model=model))
        try:
            engine = cls(model, worker=worker, draft=draft, **kw)
        except SpecUnavailable:
            worker.close()
            raise
        # a restart takes about as long as this load: the Retry-After of a lost device
        engine.memory.restart_after = max(2, math.ceil(1.5 * (time.monotonic() - t0)) + 1)
        return engine

    @property
    def hooks(self) -> ModelHooks:
        """The model's hook relay: its claiming family, then generic, never another family."""
        hooks: ModelHooks = self.model.hooks
        return hooks

    # -- parsing OpenAI bodies (other surfaces use their own parsers with
    # ``defaults`` and ``max_tokens``; see engine/request.py) ---------------------
    def parse_chat(self, body: dict[str, Any]) -> ChatRequest:
        return parse_chat(body, self.defaults, self.max_tokens)

    def parse_completion(self, body: dict[str, Any]) -> CompletionRequest:
        return parse_completion(body, self.defaults, self.max_tokens)

    # -- starting ----------------------------------------------------------------
    async def prepare(self, req: GenerationInput, *, compile_grammar: bool = True) -> Prepared:
        """Render and tokenize off the event loop, one preparation at a time (the
        grammar cache and the tokenizer stay single-threaded). Media parts are
        checked against the model, then fetched and decoded first (fetches on the
        loop, decoding in threads), outside the preparation lock."""
        if isinstance(req, ChatRequest) and req.media and req.media_items is None:
            media_pipeline(self.model, self.hooks, req.media_kinds)  # a 400 before any fetch
            req.media_items = await media_parts.load(req.media)
        if isinstance(req, ChatRequest) and self.template_defaults:  # the request's keys win
            req.template_kwargs = {**self.template_defaults, **req.template_kwargs}

        def run() -> Prepared:
            with self._prepare_lock:
                return prepare(self.model, self.hooks, req, compile_grammar=compile_grammar)

        return await asyncio.to_thread(run)

    async def count_prompt_tokens(self, req: ChatRequest) -> int:
        return len((await self.prepare(req, compile_grammar=False)).request.prompt_tokens)

    async def start(self, req: GenerationInput) -> Generation:
        """Prepare, admit and queue ``req``; 4xx / 429 / 503 are raised before anything streams."""
        self.check_open()
        self.starting += 1
        try:
            return await self._start(req)
        finally:
            self.starting -= 1

    def check_open(self) -> None:
        if self.unavailable is not None:
            retry = self.unavailable_retry
            if retry is not None:
                raise Overloaded(self.unavailable, retry.after, retry.code, restarting=True)
            raise APIError(self.unavailable, status=503, type="engine_unavailable",
                           code="engine_unavailable")
        if self.draining:
            raise Unavailable()

    def abort(self, message: str) -> None:
        """Stop now: every running and waiting request ends with ``message`` as an error
        (streams get their surface's error event); requests still being prepared are
        refused with a 503 (a forced shutdown)."""
        self.draining = self.aborted = True
        self.worker.abort(message)

    def _device_lost(self, reason: str) -> None:
        """The device failed for good (on the worker thread): refuse new work with a 503
        (``/health`` too), end every request with one to send again, and tell
        ``on_fatal`` (serve drains and exits non-zero for a supervisor to restart it)."""
        retry = Retry(self.memory.restart_after, DEVICE_FAULT)
        self.unavailable = f"engine unavailable: the device failed ({reason}); restarting"
        self.unavailable_retry = retry
        self.worker.broken = True  # its thread must not touch MLX as it ends
        self.worker.abort(self.unavailable, retry)
        log.error("device fault: %s", reason)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    @property
    def idle(self) -> bool:
        """Nothing being prepared, queued or generated (what a drain waits for)."""
        return self.starting == 0 and self.worker.active == 0 and self.worker.waiting == 0

    async def _start(self, req: GenerationInput) -> Generation:
        adapters = self.adapters.resolve(req.adapter)  # an unknown id is a 400 before any work
        prepared = await self.prepare(req)
        if self.aborted:  # stopped while this one was being prepared
            raise Unavailable()
        job = self.new_job(req, prepared, adapters)
        self.worker.submit(job)
        self.requests += 1
        return Generation(job, prepared.warning,
                          lambda fin: self._finished(fin, job.cache_note))

    def new_job(self, req: GenerationInput, prepared: Prepared,
                adapters: AdapterSet) -> GenerationJob:
        """The job for a prepared request, as :meth:`start` queues it: its budget, draft,
        prefix-cache namespace, adapters, speculation and fill (on the event loop)."""
        spec = resolve_spec(self.speculation, req.speculation)
        check_mtp(spec, self.predictor is not None, self.model.id)  # a 400 before any work
        if drafts_with_head(spec) and self.kv.enabled:
            spec = None  # the head's loops run the model unwrapped: decode plainly, batched
        mtp = (drafts_with_head(spec) and may_speculate(prepared.request, self.draft)
               and prepared.request.grammar is None)  # (as the job decides)
        job = GenerationJob(prepared.request, self.model.tokenizer,
                            EventSink(asyncio.get_running_loop()),
                            self.effective_limit(prepared.request, mtp), self.draft,
                            self.cache_namespace(req, adapters), adapters=adapters,
                            spec=spec, spec_tally=self.spec_tally)
        job.session.on_finish = self.on_finish
        job.fill = self.fill.open(job)
        job.session.usage.cache_breakpoints = self.prefix.pins.pin_request(
            job.cache_namespace, job.request.prompt_tokens, job.request.cache_pins)
        gen_checkpoint.attach(self.checkpoints, self.prefix.tier, job)  # (when it qualifies)
        return job

    def cache_namespace(self, req: GenerationInput,
                        adapters: AdapterSet | None = None) -> tuple[str, ...] | None:
        """What must match for two requests to share prefix KV (None: never cache).
        ``adapters`` is the request's resolved set (resolved here when not given)."""
        if self.draft is not None or not self.prefix.enabled:
            return None
        if adapters is None:
            adapters = self.adapters.resolve(req.adapter)
        media = ""
        if isinstance(req, ChatRequest) and req.media_items:
            media = "media:" + media_parts.digest(req.media_items)
        return (self.model.id, str(self.model.path), adapters.key, self.kv.name, media)

    def effective_limit(self, req: GenerationRequest, mtp: bool = False) -> int:
        """The completion budget after admission (400 when the prompt leaves no room;
        ``mtp``: it drafts with the model's head, whose weights and cache then count)."""
        return self.admission.limit(len(req.prompt_tokens), req.max_tokens, mtp)

    def _finished(self, fin: Finish, cache_note: str | None = None) -> None:
        self.completed += 1
        u, t = fin.usage, fin.timings
        if fin.retry is not None:  # told 503: its error says why and how long it waited
            log.warning("503 %s · prompt %d tok · %d tok out · %s", fin.retry.code,
                        u.prompt_tokens, u.completion_tokens, fin.error)
            return
        log.info("%s · prompt %d tok · %d tok out · ttft %.0f ms · %.1f tok/s · %s lane · "
                 "cache %s", fin.reason, u.prompt_tokens, u.completion_tokens,
                 1e3 * t.get("ttft_s", 0), t.get("decode_tps", 0.0), u.lane, cache_note)

    # -- other work on the model ---------------------------------------------------
    async def embed(self, texts: list[str],
                    instruction: str | None = None) -> tuple[list[list[float]], int]:
        self.check_open()
        if self.model.kind != "embedding":  # answer now, not after queued generations
            raise BadRequest(f"model {self.model.id} is not an embedding model")
        hook = self.hooks
        result: tuple[list[list[float]], int] | None = await self.worker.call(
            lambda: hook.embed(model=self.model, texts=texts, instruction=instruction))
        if result is None:
            raise BadRequest(f"model {self.model.id} is not an embedding model")
        return result

    async def rerank(self, query: str, documents: list[str], instruction: str | None = None,
                     max_doc_tokens: int | None = None) -> tuple[list[float], int]:
        """Relevance scores for ``documents`` (in order) and the tokens fed."""
        self.check_open()
        if self.model.kind != "rerank":  # answer now, not after queued generations
            raise BadRequest(f"model {self.model.id} cannot rerank: it is a {self.model.kind} "
                             "model; serve a reranker checkpoint for /v1/rerank", param="model")
        return await reranking.rerank(self.worker, self.hooks, self.model, query, documents,
                                      instruction, max_doc_tokens)

    async def transcribe(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        """The speech in ``audio`` (16 kHz mono) as text, through the family's hook."""
        self.check_open()
        if self.model.kind != "speech":  # answer now, not after queued generations
            raise BadRequest(f"model {self.model.id} cannot transcribe: it is a "
                             f"{self.model.kind} model; serve a speech checkpoint (Whisper) for "
                             "/v1/audio/transcriptions", param="model")
        hook, model = self.hooks, self.model
        result: Transcription | None = await self.worker.call(
            lambda: hook.transcribe(model=model, audio=audio, options=options))
        if result is None:
            raise BadRequest(f"model {model.id} cannot transcribe", param="model")
        return result

    def close(self) -> None:
        """Stop the worker thread (the server is shutting down)."""
        self.worker.close()

    def stats(self) -> dict[str, Any]:
        return {"total": self.requests, "completed": self.completed,
                "active": self.worker.active, "waiting": self.worker.waiting}

    def lookup_stats(self) -> dict[str, Any]:
        return engine_stats.lookup(self)

    def kv_quant_stats(self) -> dict[str, Any]:
        return engine_stats.kv_quant(self)

    def batch_stats(self) -> dict[str, Any]:
        return engine_stats.batch(self)

    def memory_stats(self) -> dict[str, Any]:
        """``/stats`` ``memory``: the measured budget and what pressure did."""
        return self.memory.stats()
