"""The model worker: the one thread that owns MLX.

Its loop takes new work from an inbox, hands generation jobs to lanes, runs
call jobs (embeddings, model mutation) between lane steps, and steps every lane
that has work. Requests only see ``submit`` / ``call`` and their own events,
never which lane ran them.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import QueueFull
from ..events import Retry
from .job import CallJob, GenerationJob
from .lanes import Lane
from .memory import DEVICE, Governor

log = logging.getLogger("mlxbun.engine")

_STOP = object()


class _Abort:
    """Inbox item: end every job of every lane with an error (a forced shutdown; with
    ``retry``, a lost device: the jobs may be sent again to the restarted engine)."""

    def __init__(self, message: str, retry: Retry | None = None):
        self.message, self.retry = message, retry


class ModelWorker:
    def __init__(self, max_waiting: int = 64):
        self.max_waiting = max_waiting
        self.lanes: list[Lane] = []  # set by the engine once the model is loaded (on this thread)
        self._inbox: queue.Queue[Any] = queue.Queue()
        # the device failed for good: the thread must not touch MLX as it ends
        self.broken = False
        self._thread = threading.Thread(target=self._run, name="mlxbun-worker", daemon=True)
        self._thread.start()
        _open_workers.add(self)

    # -- the event-loop side ---------------------------------------------------
    @property
    def waiting(self) -> int:
        """Jobs accepted but not yet running (inbox and lane queues)."""
        return int(self._inbox.qsize()) + sum(lane.waiting for lane in self.lanes)

    @property
    def active(self) -> int:
        return sum(lane.active for lane in self.lanes)

    def submit(self, job: GenerationJob) -> GenerationJob:
        if self.waiting >= self.max_waiting:
            raise QueueFull(f"generation queue is full ({self.max_waiting} waiting requests; "
                            "retry later)")
        self._inbox.put(job)
        return job

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread between decode steps."""
        job = CallJob(asyncio.get_running_loop(), fn)
        self._inbox.put(job)
        assert job.future is not None  # made with a loop
        return await job.future

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the worker thread between steps, from any thread, without
        waiting for it (timers, background tiers); its failure is only logged."""
        def run() -> None:
            try:
                fn()
            except Exception:
                log.exception("posted call failed")

        self._inbox.put(CallJob(None, run))

    def run_sync(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn`` on the worker thread from a non-async caller (start-up).

        Models must be loaded here: MLX streams are per thread, and weights
        loaded on another thread cannot be evaluated on this one. ``timeout``: seconds
        to wait before ``TimeoutError`` (the call stays queued).
        """
        job = CallJob(None, fn)
        self._inbox.put(job)
        if not job.done.wait(timeout):
            raise TimeoutError(f"the worker did not run the call within {timeout} s")
        if job.error is not None:
            raise job.error
        return job.result

    @property
    def running(self) -> bool:
        """Whether the worker takes calls (started and not closed)."""
        return self in _open_workers and self._thread.is_alive()

    def close(self, wait: float = 10.0) -> None:
        """Stop the worker after its current step and wait up to ``wait`` seconds for it
        to let go of MLX (idempotent; an open worker is closed at interpreter exit)."""
        _open_workers.discard(self)
        self._inbox.put(_STOP)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(wait)

    def abort(self, message: str, retry: Retry | None = None) -> None:
        """End every running and waiting job with ``message`` (an error; ``retry``: one
        to send again later) at the next step boundary; the worker goes on serving."""
        self._inbox.put(_Abort(message, retry))

    # -- the worker thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if not self.broken:  # (a lost device: the process ends with os._exit anyway)
                release_thread_mlx()

    def _loop(self) -> None:
        while True:
            busy = any(lane.active or lane.waiting for lane in self.lanes)
            try:
                item = self._inbox.get(block=not busy, timeout=None if busy else self._rest_in())
            except queue.Empty:
                item = None
                if not busy:
                    self._rest()
            while item is not None:
                if item is _STOP:
                    return self._shutdown()
                self._take(item)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            # a lane running a seeded request goes alone: nothing else may draw random numbers
            lanes = [lane for lane in self.lanes if lane.exclusive] or self.lanes
            for lane in lanes:
                if lane.active or lane.waiting:
                    self._step(lane)

    def _rest_in(self) -> float | None:
        """Seconds until an idle lane gives memory back (``lanes/idle.py``; None: none
        will, the worker waits for its next message)."""
        due = [d for d in (_idle_in(lane) for lane in self.lanes) if d is not None]
        return min(due, default=None)

    def _rest(self) -> None:
        """Idle lanes whose time has come give memory back (a failure is only logged)."""
        for lane in self.lanes:
            rest: Callable[[], Any] | None = getattr(lane, "rest", None)
            if rest is not None and _idle_in(lane) == 0:
                try:
                    rest()
                except Exception:
                    log.exception("%s lane: giving memory back failed", lane.name)

    @staticmethod
    def _step(lane: Lane) -> None:
        """One lane step; a failure the lane did not pin on one job ends that lane's jobs
        with an error (never the worker: the next request must still be served)."""
        try:
            lane.step()
        except Exception as exc:
            log.exception("%s lane step failed", lane.name)
            gov: Governor | None = getattr(lane, "governor", None)
            if gov is not None and gov.classify(exc) == DEVICE:  # (met past the lane's own
                message, retry = gov.refusal(DEVICE, exc)      # handling: lost all the same)
                lane.close(message, reason="error", retry=retry)
                return
            lane.close(f"internal error: {exc}", reason="error")

    def _take(self, job: GenerationJob | CallJob | _Abort) -> None:
        if isinstance(job, _Abort):
            for lane in self.lanes:
                lane.close(job.message, reason="error", retry=job.retry)
            return
        if isinstance(job, CallJob):
            job.run()
            return
        t0 = time.perf_counter()
        for lane in self.lanes:
            if lane.accepts(job):
                lane.add(job)
                job.session.span("completion.placement", t0, lane=lane.name)
                return
        job.close("error", "no lane can run this request")

    def _shutdown(self) -> None:
        for lane in self.lanes:
            lane.close()


def _idle_in(lane: Lane) -> float | None:
    """A lane's :meth:`~.lanes.idle.IdleRelease.idle_in` (None: it has none)."""
    idle_in = getattr(lane, "idle_in", None)
    return idle_in() if idle_in is not None else None


def release_thread_mlx() -> None:
    """Let go of what MLX keeps for the calling thread, before that thread ends.

    MLX's Python binding keeps each thread's random key (what ``mx.random`` draws from and
    ``mx.random.seed`` sets) in a native thread-local that holds a Python object. Its
    destructor runs when the OS thread ends, after ``Thread.join()`` has returned, and
    takes the GIL; if the main thread is finalizing the interpreter by then, CPython ends
    the thread inside that destructor and the process aborts ("terminate called without
    an active exception", exit 134), at random. ``mx.clear_streams()``, MLX's end-of-thread
    call, drops that key (and the thread's streams and compile cache) while the GIL is
    ours, so the thread's exit runs no Python. ``mx.synchronize()`` first: no queued work
    is lost. Call it last on any non-main thread that ran MLX work."""
    import mlx.core as mx

    try:
        mx.synchronize()
    finally:
        clear = getattr(mx, "clear_streams", None)  # older MLX: no per-thread state
        if clear is not None:
            clear()


_open_workers: weakref.WeakSet[ModelWorker] = weakref.WeakSet()


@atexit.register
def _close_open_workers() -> None:
    """A script that never called ``close()``: stop its workers while the interpreter is
    whole (atexit runs before finalization), so their threads end as ``close()`` ends them."""
    for worker in list(_open_workers):
        worker.close(wait=5.0)
