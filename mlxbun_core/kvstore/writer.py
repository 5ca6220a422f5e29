"""The write-behind queue: one background thread writes entries; inference never waits.

Jobs arrive from the MLX owner thread already evaluated (see ``codec.encode``); the
thread reads them through numpy, hashes and writes. *Urgent* jobs (an entry leaving
RAM, a flush, a drain) go first and at once; *background* jobs (write-behind after a
request publishes its KV) wait until the engine is idle, or ``MAX_DEFER_S``. A queued
job whose tokens a newer trimmable job of the same namespace extends is superseded
(the newer file serves it by trimming). Queued bytes are capped: past the cap a new
job is dropped (its entry stays in RAM, dirty, and is offered again later).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("mlxbun.kvstore")

MAX_DEFER_S = 30.0


@dataclass
class WriteJob:
    ns: str
    tokens: np.ndarray  # int32
    header: dict
    tensors: list  # evaluated MLX arrays
    mx_dtypes: list
    nbytes: int
    trimmable: bool
    urgent: bool = False
    queued_at: float = field(default_factory=time.monotonic)
    done: list = field(default_factory=list)  # callbacks(ok: bool), riders included

    def same_tokens(self, other: WriteJob) -> bool:
        return self.ns == other.ns and np.array_equal(self.tokens, other.tokens)

    def extends(self, other: WriteJob) -> bool:
        """Whether ``other``'s tokens are a strict prefix of ours (same namespace)."""
        return (self.ns == other.ns and other.tokens.size < self.tokens.size
                and np.array_equal(self.tokens[:other.tokens.size], other.tokens))


class WriteQueue:
    def __init__(self, write: Callable[[WriteJob], bool | None], *, max_bytes: int,
                 busy: Callable[[], bool] = lambda: False,
                 tick: Callable[[], None] | None = None, tick_s: float = 5.0):
        self._write = write  # does the I/O: True durable, False failed, None skipped
        self.max_bytes = max_bytes
        self._busy = busy
        self._tick, self._tick_s = tick, tick_s
        self._queue: list[WriteJob] = []
        self._current: WriteJob | None = None
        self._cond = threading.Condition()
        self._closed = False
        self.written = self.dropped = self.failed = self.superseded = 0
        self._thread = threading.Thread(target=self._loop, name="mlxbun-kvstore-writer",
                                        daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (self._current is not None)

    @property
    def pending_bytes(self) -> int:
        with self._cond:
            return sum(j.nbytes for j in self._queue) + (
                self._current.nbytes if self._current is not None else 0)

    def submit(self, job: WriteJob) -> bool:
        """Queue ``job``; False when it was dropped (queue full or closed)."""
        with self._cond:
            if self._closed:
                return self._drop(job)
            for q in self._queue:
                if q.same_tokens(job):  # already queued: ride along
                    q.urgent |= job.urgent
                    q.done.extend(job.done)
                    return True
            if job.trimmable:
                for q in [q for q in self._queue if job.extends(q)]:
                    self._queue.remove(q)
                    self.superseded += 1
                    job.urgent |= q.urgent
                    job.done.extend(q.done)
            queued = sum(j.nbytes for j in self._queue)
            if self._queue and queued + job.nbytes > self.max_bytes:
                return self._drop(job)
            self._queue.append(job)
            self._cond.notify_all()
            return True

    def _drop(self, job: WriteJob) -> bool:
        self.dropped += 1
        for cb in job.done:
            _call(cb, False)
        return False

    def on_tick(self, fn: Callable[[], None], every_s: float) -> None:
        """Call ``fn`` on the writer thread about every ``every_s`` seconds while idle."""
        with self._cond:
            self._tick, self._tick_s = fn, max(0.05, every_s)
            self._cond.notify_all()

    def poke(self) -> None:
        """A queued job became urgent: look again now."""
        with self._cond:
            self._cond.notify_all()

    def expedite(self) -> None:
        """Every queued job becomes urgent (a flush: write now, busy or not)."""
        with self._cond:
            for j in self._queue:
                j.urgent = True
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is queued or being written; False at the deadline."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._current is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            dropped, self._queue = self._queue, []
            self._cond.notify_all()
        for job in dropped:
            self._drop(job)

    # -- the writer thread -----------------------------------------------------------
    def _pick(self) -> WriteJob | None:
        for j in self._queue:
            if j.urgent:
                return j
        if self._queue:
            oldest = self._queue[0]
            if time.monotonic() - oldest.queued_at > MAX_DEFER_S or not self._busy():
                return oldest
        return None

    def _loop(self) -> None:
        last_tick = time.monotonic()
        while True:
            with self._cond:
                job = None
                while not self._closed:
                    job = self._pick()
                    if job is not None:
                        break
                    wait = 0.2 if self._queue else self._tick_s
                    self._cond.wait(wait)
                    if time.monotonic() - last_tick >= self._tick_s:
                        break
                if self._closed:
                    return
                if job is not None:
                    self._queue.remove(job)
                    self._current = job
            if job is None:
                last_tick = time.monotonic()
                if self._tick is not None:
                    _call(self._tick)
                continue
            result: bool | None = False
            try:
                result = self._write(job)
            except Exception:  # the tier must never take serving down
                log.exception("ssd cache: write failed")
            ok = bool(result)
            job.tensors = []  # free the arrays now, not when the callbacks drop the job
            for cb in job.done:  # before the job counts as done: after wait_idle, a written
                _call(cb, ok)    # entry is durable (a flush-then-demote frees it)
            with self._cond:
                self._current = None
                if result is None:
                    self.dropped += 1
                elif ok:
                    self.written += 1
                else:
                    self.failed += 1
                self._cond.notify_all()


def _call(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("ssd cache: callback failed")
