"""The serial lane: one request at a time through mlx-lm's own decode loop.

It runs what cannot batch (a mounted draft model: speculative decoding; prompt
embeddings; media requests, which run their pipeline's own forward pass; seeded
requests, which are reproducible only alone) and everything under ``--batch 1``.
Each ``step`` does one prefill chunk (sized by the engine's pacer, ``pace.py``) or
one token, so cancellation lands within a step and the worker can run calls and
other lanes in between: the lane reads the prompt itself (mlx-lm's ``generate_step``
and ``speculative_generate_step`` would read all of it before their first yield)
and hands them the filled cache. A media pipeline runs its own prefill; it gets a
callback that stops it between chunks once its job is cancelled, and (when it takes
one) the KV cache to fill: a cached prefix holding all its media, or a fresh one.
Requests start from the longest cached prefix and publish their KV to the prefix
cache when they end.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from ... import cache_ops, kvquant
from ...contract import LogitsProcessor, TokenPredictor
from ...events import Retry
from .. import prefill_shapes
from ..cache_explain import Probe, explain_job
from ..job import GenerationJob
from ..memory import OOM, Governor
from ..prompt_cache import PrefixCache, trimmable
from ..prompt_scoring import PromptScorer
from ..speculate import MTP, MtpStream, rewindable, spec_steps, trim_to
from .draft_model import draft_model_steps
from .pace import PrefillPacer
from .random_state import fresh_random_state, skip_draws
from .spec_stream import spec_stream

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

    from ...adapters import AdapterManager
    from ...model import MediaPrompt
    from ..admission import Admission

log = logging.getLogger("mlxbun.engine")

Steps: TypeAlias = ("Generator[tuple[int, mx.array] | tuple[int, mx.array, list[int]] | None,"
                    " None, None]")
"""A job's steps: None for a prefill chunk, else a sampled token and its log-probs (and,
with fill, the forced run fed after it)."""


class SerialLane:
    name = "serial"

    def __init__(self, model: nn.Module, prefix: PrefixCache | None = None,
                 admission: Admission | None = None,
                 adapters: AdapterManager | None = None, pacer: PrefillPacer | None = None,
                 kv: kvquant.KVScheme = kvquant.OFF, predictor: TokenPredictor | None = None,
                 governor: Governor | None = None):
        self.predictor = predictor  # the model's MTP head (jobs with draft_kind "mtp")
        self.governor = governor  # the engine's memory governor (faults, pressure)
        self.kv = kv  # the KV scheme: every forward pass quantizes its cache after it runs
        self.model = kvquant.quantizing(model, kv)  # the mlx.nn.Module (or its wrapper)
        self.prefix = prefix
        self.admission = admission
        self.adapters = adapters  # the engine's AdapterManager (None: no LoRA support)
        self.pacer = pacer or PrefillPacer()  # prompt tokens per chunk, from measured speed
        self._queue: collections.deque[GenerationJob] = collections.deque()
        self._job: GenerationJob | None = None
        self._steps: Steps | None = None
        # (cache, tokens in it) of the running job, when it may be published
        self._kv: tuple[list[Any], list[int]] | None = None

    def accepts(self, job: GenerationJob) -> bool:
        return True

    def add(self, job: GenerationJob) -> None:
        self._queue.append(job)

    @property
    def active(self) -> int:
        return 1 if self._job is not None else 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def jobs(self) -> list[GenerationJob]:
        job = self._job
        return ([job] if job is not None else []) + list(self._queue)

    @property
    def exclusive(self) -> bool:
        return self._job is not None and self._job.request.sampling.seed is not None

    def step(self) -> None:
        if self._job is None and not self._admit():
            return
        job, steps = self._job, self._steps
        if job is None or steps is None:  # set together by _admit
            return
        try:
            if job.cancelled.is_set():
                return self._end(job.close, "cancelled", publish=job.keep_kv_on_cancel)
            if self.adapters is not None:  # another lane may have run another set meanwhile
                self.adapters.activate(job.adapters)
            if self.governor is not None:
                self.governor.inject()
            out = next(steps)
            if out is None:  # a prefill chunk (after the last one, a max_tokens 0 job ends)
                if job.finished:
                    self._end(publish=True)
                return
            token, logprobs, *more = out
            forced: list[int] = more[0] if more else []
            if self._kv is not None:
                self._kv[1].extend([token, *forced])
            job.deliver(token, logprobs, forced)
            if job.finished:
                self._end(publish=True)
        except PrefillCancelled:
            self._end(job.close, "cancelled")
        except Exception as exc:  # report to the request, keep serving others
            if self._pressure(job, exc):
                return
            log.exception("generation failed")
            fresh_random_state()  # a failure inside a compiled sampler can leave it unusable
            self._end(job.close, "cancelled" if job.cancelled.is_set() else "error", str(exc))

    def _pressure(self, job: GenerationJob, exc: Exception) -> bool:
        """Memory ran out (the job ends with a 503 to send again, its KV freed) or the
        device is lost (the engine ends); False for any other failure."""
        gov = self.governor
        kind = gov.classify(exc) if gov is not None else None  # (--distributed: see there)
        if gov is None or kind is None:
            return False
        message, retry = gov.refusal(kind, exc)
        log.warning("%s lane: %s", self.name, message)
        self._end(job.close, "error", message, retry)
        if kind == OOM:
            import mlx.core as mx

            mx.clear_cache()  # the freed KV back to the device at once
        return True

    def _admit(self) -> bool:
        while self._queue:
            job = self._queue.popleft()
            if job.cancelled.is_set():
                job.close("cancelled")
                continue
            job.mark_started(self.name)
            if self.admission is not None:  # counted, never held back: one job always fits
                self.admission.reserve(job)
            if job.request.sampling.seed is not None:
                import mlx.core as mx

                mx.random.seed(job.request.sampling.seed)
                skip_draws(job.replayed)  # a resumed generation: past the draws it replays
            self._job, self._steps = job, self._decode(job)
            return True
        return False

    def _end(self, close: Callable[..., None] | None = None, *args: object,
             publish: bool = False) -> None:
        job, steps, kv = self._job, self._steps, self._kv
        self._job = self._steps = self._kv = None
        assert job is not None  # only the running job ends here
        if steps is not None:
            steps.close()  # frees the KV cache now, not at the next GC
        if self.admission is not None:
            self.admission.release(job)
        if close is not None:
            close(*args)
        if publish and kv is not None and self.prefix is not None:
            if job.spec is not None:  # a speculative burst may have fed past the end
                trim_to(kv[0], len(kv[1]))
            self.prefix.store(job.cache_namespace, kv[1], kv[0])
        if job.request.sampling.seed is not None:
            fresh_random_state()  # a seeded request must not make later ones repeatable

    def _decode(self, job: GenerationJob) -> Steps:
        """Prefill chunks (yield None), then mlx-lm's decode loop: ``(token, logprobs)``."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        if job.draft is not None:
            job.admitted(0)
            yield from draft_model_steps(self.model, job, job.draft, self.kv, self.pacer)
            return
        req = job.request
        if req.media is not None:  # the media pipeline's own forward pass
            yield from self._media(job, req.media)
            return
        prompt, n, note = req.prompt_tokens, 0, None
        cache: list[Any] | None = None
        prefix = self.prefix
        cacheable = (job.cache_namespace is not None and prefix is not None
                     and req.input_embeddings is None)
        # a scored prompt needs every position's logits: no cached prefix (it still publishes)
        if cacheable and prefix is not None and not req.score_prompt:
            t0, probe = time.perf_counter(), Probe()
            cache, n = prefix.lookup_dense(job.cache_namespace, prompt, probe)
            note = explain_job(prefix, job, probe, n)
            job.session.phases["cache_lookup_s"] = time.perf_counter() - t0
        if cache is None:
            t0 = time.perf_counter()
            cache = cache_ops.make(self.model)
            job.session.span("prefill.batch_setup", t0, lane=self.name)
        job.admitted(n, note)
        if self._mtp(job):
            yield from self._mtp_decode(job, cache, n, cacheable)
            return
        scorer = (PromptScorer(self.model, cache, job.session.tokenizer, prompt,
                               req.sampling.top_logprobs) if req.score_prompt else None)
        n = yield from self._prefill(job, cache, n, publish=cacheable,
                                     read=None if scorer is None else scorer.read)
        if scorer is not None:
            job.emit(job.session.scored(scorer.entries))
        if cacheable:
            self._kv = (cache, list(prompt))
        if job.limit == 0:  # echo: the prompt alone, nothing generated
            job.close("length")
            yield None
            return
        if job.spec is not None and len(prompt) - n == 1 and rewindable(cache, 2):
            yield from self._lookup_decode(job, cache, n)  # (with fill: both, guided.py)
            return
        if job.fill is not None:  # the grammar's forced runs ride with sampled tokens
            from ..fill.decode import fill_steps

            yield from fill_steps(self.model, prompt[n:], prompt, cache, req.sampler,
                                  req.processors, job.fill)
            return
        procs = _with_context(req.processors, prompt[:n])
        emb = req.input_embeddings[n:] if req.input_embeddings is not None else None
        sampler = req.sampler
        if job.session.spans is not None and sampler is not None:  # traced: token zero's stages
            from ..stages import probed

            sampler, procs = probed(sampler, procs or [], job.session.spanned)
        # mlx-lm annotates its tokens as arrays; it yields them as ints (``y.item()``)
        yield from cast("Iterator[tuple[int, mx.array]]", generate_step(
            mx.array(prompt[n:]), self.model, max_tokens=-1,
            sampler=sampler, logits_processors=procs,
            prompt_cache=cache, input_embeddings=emb))

    def _prefill(self, job: GenerationJob, cache: list[Any], start: int, publish: bool,
                 read: Callable[[list[int], int], None] | None = None
                 ) -> Generator[None, None, int]:
        """Read the prompt (or its embeddings) from ``start`` up to its last token into
        ``cache``, one paced chunk per step (the cancel flag is checked in between);
        returns where the decode starts. With ``publish``, caches that cannot rewind
        are snapshotted at the prompt boundary for the next turn. ``read(chunk, next)``
        replaces the model's forward (an MTP stream, which keeps the hidden states)."""
        req = job.request
        prompt, emb = req.prompt_tokens, req.input_embeddings
        end = (len(emb) if emb is not None else len(prompt)) - 1
        t0, i = time.perf_counter(), start
        while i < end:
            size = self.pacer.chunk()
            j = min(i + size, end)
            t1 = time.perf_counter()
            with self.pacer.timed(size) as timer:  # (bucketed lengths on CUDA)
                if read is not None:
                    read(prompt[i:j], prompt[j])
                else:
                    prefill_shapes.prefill(self.model, prompt[i:j], cache,
                                           None if emb is None else emb[i:j])
                timer.tokens = j - i
            job.session.span("prefill.chunk", t1, tokens=j - i)
            i = j
            yield None
        if publish and end > start and self.prefix is not None and not trimmable(cache):
            t1 = time.perf_counter()
            self.prefix.store(job.cache_namespace, prompt[:end], cache_ops.copy(cache),
                              boundary=True)
            job.session.span("prefill.kv_maintenance", t1, snapshot_tokens=end)
        job.session.phases["prefill_s"] = time.perf_counter() - t0
        return max(start, end)

    def _media(self, job: GenerationJob, media: MediaPrompt) -> Iterator[tuple[int, mx.array]]:
        """The media pipeline's run; one that takes ``between_chunks`` gets the cancel
        check between its prefill chunks (it cannot yield before its first token)."""
        req = job.request
        run: Callable[..., Iterator[tuple[int, mx.array]]] = media.run
        size = self.pacer.chunk()
        last: list[tuple[int, float]] = []  # (tokens read, when) at the previous boundary

        def between_chunks(done: int) -> None:
            now = time.perf_counter()
            if last:  # the first interval also ran the media encoder: not a prefill rate
                read, at = last[0]
                self.pacer.record(done - read, now - at, size)
            last[:] = [(done, now)]
            if job.cancelled.is_set():
                raise PrefillCancelled(f"cancelled after {done} prompt tokens")

        kw: dict[str, Any] = {}
        if _takes(run, "between_chunks"):
            kw.update(prefill_step=size, between_chunks=between_chunks)
        cache, n, note = self._media_cache(job, media)
        if cache is not None:  # published when the job ends, as a plain prompt's is
            kw.update(prompt_cache=cache, start=n)
            self._kv = (cache, list(req.prompt_tokens))
        job.admitted(n, note)
        return run(req.sampler, req.processors or None, **kw)

    def _media_cache(self, job: GenerationJob, media: MediaPrompt
                     ) -> tuple[list[Any] | None, int, str | None]:
        """The KV cache a media run fills: a cached prefix that holds every media token
        (its length), else a fresh one; ``(None, 0, None)`` when the run cannot take one
        or the request is never cached. A prefix that ends inside the media is no use:
        the run then reads the whole prompt."""
        prefix = self.prefix
        if (prefix is None or job.cache_namespace is None or media.new_cache is None
                or not _takes(media.run, "prompt_cache")):
            return None, 0, None
        t0, probe = time.perf_counter(), Probe()
        cache, n = prefix.lookup_dense(job.cache_namespace, job.request.prompt_tokens, probe)
        if cache is None or media.resume_from is None or n < media.resume_from:
            cache, n = media.new_cache(), 0
        note = explain_job(prefix, job, probe, n)
        job.session.phases["cache_lookup_s"] = time.perf_counter() - t0
        return cache, n, note

    def _lookup_decode(self, job: GenerationJob, cache: list[Any], n: int) -> Steps:
        """Prompt-lookup speculation (``speculate/``) from the filled ``cache``."""
        req, usage = job.request, job.session.usage
        usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
        if job.spec_tally is not None:
            job.spec_tally.requests += 1
        stream = spec_stream(job, self.model, cache, list(req.prompt_tokens[:n]))
        yield from spec_steps(stream, req.prompt_tokens[n])

    def _mtp(self, job: GenerationJob) -> bool:
        """Whether ``job`` drafts with the model's MTP head (not under a KV scheme: the
        head's loop runs the model unwrapped)."""
        return (job.spec is not None and job.spec.kind == MTP and self.predictor is not None
                and self.kv is kvquant.OFF and job.request.input_embeddings is None)

    def _mtp_decode(self, job: GenerationJob, cache: list[Any], n: int,
                    cacheable: bool) -> Steps:
        """MTP speculation (``speculate/mtp.py``): the prompt is read through the stream
        (the head keeps each position's hidden state), then verify rounds. A cache that
        cannot rewind is published only at the prompt boundary (a round may have fed
        past the reply's end)."""
        req, usage = job.request, job.session.usage
        assert job.spec is not None and self.predictor is not None and req.sampler is not None
        usage.lane = "serial+spec"
        spec = usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
        if job.spec_tally is not None:
            job.spec_tally.requests += 1
        prompt = req.prompt_tokens
        stream = MtpStream(self.predictor, cache, list(prompt[:n]),
                           job.spec.num_draft_tokens or self.predictor.num_draft_tokens,
                           req.sampler, req.processors, spec, job.spec_tally, job.fill)
        yield from self._prefill(job, cache, n, publish=cacheable, read=stream.read)
        if cacheable and trimmable(cache):
            self._kv = (cache, list(prompt))
        yield from spec_steps(stream, prompt[-1])

    def close(self, error: str = "server shutting down", reason: str = "cancelled",
              retry: Retry | None = None) -> None:
        if self._job is not None:
            self._end(self._job.close, reason, error, retry)
        while self._queue:
            self._queue.popleft().close(reason, error, retry)


def _with_context(processors: list[LogitsProcessor],
                  prefix: list[int]) -> list[LogitsProcessor] | None:
    """Logits processors see the whole prompt even when part of it came from the cache."""
    if not processors:
        return None
    if not prefix:
        return processors
    import mlx.core as mx

    head = mx.array(prefix)

    def seeing_all(p: LogitsProcessor) -> LogitsProcessor:
        return lambda tokens, logits: p(mx.concatenate([head, tokens]), logits)

    return [seeing_all(p) for p in processors]


class PrefillCancelled(Exception):
    """Raised between a media pipeline's prefill chunks when its job was cancelled."""


def _takes(fn: Callable[..., object], name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
