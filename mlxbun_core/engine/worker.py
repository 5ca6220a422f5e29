"""The model worker: one thread that owns the model lease.

All forward passes (generation and embeddings) run here, off the event loop, one
job at a time (the serial lane). Each job reports to its request through an
asyncio queue. A batched lane can later take jobs from the same queue: requests
only see ``submit``/``call`` and events, never which lane ran them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from ..errors import QueueFull
from .session import GenerationRequest, GenerationSession

log = logging.getLogger("mlxbun.engine")


class Job:
    """Base job: ``run()`` on the worker thread; results posted to ``loop``."""

    log_failures = True  # False where the caller reports the exception itself

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.cancelled = threading.Event()

    def cancel(self):
        self.cancelled.set()

    def run(self, worker: "ModelWorker"):
        raise NotImplementedError

    def fail(self, exc: BaseException):
        raise NotImplementedError


class CallJob(Job):
    """Runs an arbitrary function under the lease (embeddings, model mutation)."""

    def __init__(self, loop, fn: Callable[[], Any]):
        super().__init__(loop)
        self.fn = fn
        self.future: asyncio.Future = loop.create_future()

    def run(self, worker):
        result = self.fn()
        self.loop.call_soon_threadsafe(_set_result, self.future, result)

    def fail(self, exc):
        self.loop.call_soon_threadsafe(_set_exception, self.future, exc)


def _set_result(fut, value):
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut, exc):
    if not fut.done():
        fut.set_exception(exc)


class GenerationJob(Job):
    def __init__(self, loop, request: GenerationRequest, model, tokenizer, limit, draft=None):
        super().__init__(loop)
        self.request = request
        self.model = model
        self.limit = limit
        # a grammar matcher cannot rewind rejected drafts: constrained requests decode plainly
        self.draft = draft if request.grammar is None else None
        self.session = GenerationSession(request, tokenizer, limit)
        self.events: asyncio.Queue = asyncio.Queue()

    def _post(self, events: list):
        if events:
            self.loop.call_soon_threadsafe(self.events.put_nowait, events)

    def _steps(self):
        """mlx-lm's decode loop for this request: plain, or speculative with a draft.

        Yields ``(token, logprobs, from_draft)``.
        """
        import mlx.core as mx
        from mlx_lm.generate import generate_step, speculative_generate_step

        req, sess = self.request, self.session
        prompt = mx.array(req.prompt_tokens)
        sampler, procs = req.sampler, req.processors or None
        if self.draft is None:
            for token, logprobs in generate_step(prompt, self.model, max_tokens=-1, sampler=sampler,
                                                 logits_processors=procs,
                                                 input_embeddings=req.input_embeddings):
                yield token, logprobs, False
            return
        sess.usage.lane = "serial+spec"
        spec = sess.usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
        n = self.draft.num_draft_tokens
        for token, logprobs, from_draft in speculative_generate_step(
                prompt, self.model, self.draft.model, num_draft_tokens=n,
                max_tokens=self.limit or (1 << 30), sampler=sampler, logits_processors=procs):
            if from_draft:
                spec["accepted"] += 1
            else:  # every verify round ends with one token of the target's own
                spec["targetCalls"] += 1
                spec["drafted"] += n
            yield token, logprobs, from_draft

    def run(self, worker):
        import mlx.core as mx

        req, sess = self.request, self.session
        if req.sampling.seed is not None:
            mx.random.seed(req.sampling.seed)
        steps = self._steps()
        try:
            for token, logprobs, _ in steps:
                if self.cancelled.is_set():
                    self._post(sess.finish("cancelled"))
                    return
                events = sess.step(token, logprobs)
                if sess.finished is None and req.grammar is not None and req.grammar.done:
                    events += sess.finish("stop")  # only EOS could follow: skip that step
                self._post(events)
                if sess.finished is not None:
                    return
        finally:
            steps.close()  # frees the KV cache now, not at the next GC
            if req.sampling.seed is not None:
                fresh_random_state()  # a seeded request must not make later ones repeatable

    def fail(self, exc):
        fresh_random_state()  # a failure inside a compiled sampler can leave the state unusable
        reason = "cancelled" if self.cancelled.is_set() else "error"
        self._post(self.session.finish(reason, error=str(exc)))


def fresh_random_state():
    import mlx.core as mx

    mx.random.seed(int.from_bytes(os.urandom(8), "little"))


class ModelWorker:
    def __init__(self, max_waiting: int = 64):
        self.max_waiting = max_waiting
        self._jobs: "queue.Queue[Job | None]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="mlxbun-worker", daemon=True)
        self.busy = False
        self.completed = 0
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def submit(self, job: Job) -> Job:
        if self._jobs.qsize() >= self.max_waiting:
            raise QueueFull("generation queue is full (64 waiting requests)")
        self._jobs.put(job)
        return job

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread under the model lease."""
        job = self.submit(CallJob(asyncio.get_running_loop(), fn))
        return await job.future

    def run_sync(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread from a non-async caller (start-up).

        Models must be loaded here: MLX streams are per thread, and weights
        loaded on another thread cannot be evaluated on this one.
        """
        box: dict = {}
        done = threading.Event()

        class _Sync(Job):
            log_failures = False

            def run(self, worker):
                box["value"] = fn()
                done.set()

            def fail(self, exc):
                box["error"] = exc
                done.set()

        self._jobs.put(_Sync(None))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self):
        self._jobs.put(None)

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                job.fail(RuntimeError("cancelled"))
                continue
            self.busy = True
            started = time.perf_counter()
            try:
                job.run(self)
            except Exception as exc:  # report to the request, keep serving others
                if job.log_failures:
                    log.exception("job failed")
                job.fail(exc)
            finally:
                self.busy = False
                self.completed += 1
                log.debug("job done in %.3fs", time.perf_counter() - started)
