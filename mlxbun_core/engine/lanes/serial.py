"""The serial lane: one request at a time through mlx-lm's own decode loop.

It runs what cannot batch (a mounted draft model: speculative decoding; prompt
embeddings; media requests, which run their pipeline's own forward pass; seeded
requests, which are reproducible only alone) and everything under ``--batch 1``.
Each ``step`` does one prefill chunk or one token, so cancellation lands within
a step and the worker can run calls and other lanes in between. Plain requests
start from the longest cached prefix and publish their KV to the prefix cache
when they end.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Iterator, Optional

from ... import kvquant
from ..job import GenerationJob
from ..prompt_cache import PrefixCache, trimmable

log = logging.getLogger("mlxbun.engine")


class SerialLane:
    name = "serial"

    def __init__(self, model, prefix: Optional[PrefixCache] = None, admission=None,
                 prefill_step: int = 2048, adapters=None, kv=kvquant.OFF):
        self.kv = kv  # the KV scheme: every forward pass quantizes its cache after it runs
        self.model = kvquant.quantizing(model, kv)  # the mlx.nn.Module (or its wrapper)
        self.prefix = prefix
        self.admission = admission
        self.adapters = adapters  # the engine's AdapterManager (None: no LoRA support)
        self.prefill_step = prefill_step
        self._queue: collections.deque[GenerationJob] = collections.deque()
        self._job: Optional[GenerationJob] = None
        self._steps: Optional[Iterator] = None
        self._kv = None  # (cache, tokens in it) of the running job, when it may be published

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

    @property
    def exclusive(self) -> bool:
        return self._job is not None and self._job.request.sampling.seed is not None

    def step(self) -> None:
        if self._job is None and not self._admit():
            return
        job = self._job
        try:
            if job.cancelled.is_set():
                return self._end(job.close, "cancelled")
            if self.adapters is not None:  # another lane may have run another set meanwhile
                self.adapters.activate(job.adapters)
            out = next(self._steps)
            if out is None:  # a prefill chunk
                return
            token, logprobs = out
            if self._kv is not None:
                self._kv[1].append(token)
            job.deliver(token, logprobs)
            if job.finished:
                self._end(publish=True)
        except Exception as exc:  # report to the request, keep serving others
            log.exception("generation failed")
            fresh_random_state()  # a failure inside a compiled sampler can leave it unusable
            self._end(job.close, "cancelled" if job.cancelled.is_set() else "error", str(exc))

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
            self._job, self._steps = job, self._decode(job)
            return True
        return False

    def _end(self, close=None, *args, publish: bool = False) -> None:
        job, steps, kv = self._job, self._steps, self._kv
        self._job = self._steps = self._kv = None
        if steps is not None:
            steps.close()  # frees the KV cache now, not at the next GC
        if self.admission is not None:
            self.admission.release(job)
        if close is not None:
            close(*args)
        if publish and kv is not None:
            self.prefix.store(job.cache_namespace, kv[1], kv[0])
        if job.request.sampling.seed is not None:
            fresh_random_state()  # a seeded request must not make later ones repeatable

    def _decode(self, job: GenerationJob):
        """Prefill chunks (yield None), then mlx-lm's decode loop: ``(token, logprobs)``."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        if job.draft is not None:
            job.admitted(0)
            yield from self._speculate(job)
            return
        req = job.request
        if req.media is not None:  # the media pipeline's own forward pass; no prefix cache
            job.admitted(0)
            yield from req.media.run(req.sampler, req.processors or None)
            return
        prompt, cache, n = req.prompt_tokens, None, 0
        cacheable = (job.cache_namespace is not None and self.prefix is not None
                     and req.input_embeddings is None)
        if cacheable:
            t0 = time.perf_counter()
            cache, n = self.prefix.lookup(job.cache_namespace, prompt)
            job.session.phases["cache_lookup_s"] = time.perf_counter() - t0
            if cache is None:
                from mlx_lm.models.cache import make_prompt_cache

                cache = make_prompt_cache(self.model)
        job.admitted(n)
        if cacheable:
            yield from self._prefill(job, cache, prompt, n)
            n = len(prompt) - 1
            self._kv = (cache, list(prompt))
        procs = _with_context(req.processors, prompt[:n])
        for token, logprobs in generate_step(mx.array(prompt[n:]), self.model, max_tokens=-1,
                                             sampler=req.sampler, logits_processors=procs,
                                             prompt_cache=cache,
                                             prefill_step_size=self.prefill_step,
                                             input_embeddings=req.input_embeddings):
            yield token, logprobs

    def _prefill(self, job: GenerationJob, cache, prompt: list, start: int):
        """Run ``prompt[start:-1]`` into ``cache`` one chunk per step; snapshot the
        prompt boundary for caches that cannot rewind."""
        import mlx.core as mx

        t0, end = time.perf_counter(), len(prompt) - 1
        for i in range(start, end, self.prefill_step):
            chunk = mx.array(prompt[i:min(i + self.prefill_step, end)])[None]
            self.model(chunk, cache=cache)
            mx.eval([c.state for c in cache])
            yield None
        if end > start and not trimmable(cache):
            import copy

            self.prefix.store(job.cache_namespace, prompt[:end], copy.deepcopy(cache),
                              boundary=True)
        job.session.phases["prefill_s"] = time.perf_counter() - t0

    def _speculate(self, job: GenerationJob):
        """Speculative decoding with the mounted draft (the prefix cache is bypassed)."""
        import mlx.core as mx
        from mlx_lm.generate import speculative_generate_step

        req, usage = job.request, job.session.usage
        usage.lane = "serial+spec"
        spec = usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
        n = job.draft.num_draft_tokens
        for token, logprobs, from_draft in speculative_generate_step(
                mx.array(req.prompt_tokens), self.model,
                kvquant.quantizing(job.draft.model, self.kv), num_draft_tokens=n,
                max_tokens=job.limit or (1 << 30), sampler=req.sampler,
                logits_processors=req.processors or None):
            if from_draft:
                spec["accepted"] += 1
            else:  # every verify round ends with one token of the target's own
                spec["targetCalls"] += 1
                spec["drafted"] += n
            yield token, logprobs

    def close(self, error: str = "server shutting down", reason: str = "cancelled") -> None:
        if self._job is not None:
            self._end(self._job.close, reason, error)
        while self._queue:
            self._queue.popleft().close(reason, error)


def _with_context(processors: list, prefix: list):
    """Logits processors see the whole prompt even when part of it came from the cache."""
    if not processors:
        return None
    if not prefix:
        return processors
    import mlx.core as mx

    head = mx.array(prefix)
    return [lambda tokens, logits, p=p: p(mx.concatenate([head, tokens]), logits)
            for p in processors]


def fresh_random_state():
    import mlx.core as mx

    mx.random.seed(int.from_bytes(os.urandom(8), "little"))
