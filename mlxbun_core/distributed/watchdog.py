"""Rank 0 notices a rank that died or hangs, within seconds, and never hangs itself.

MLX's collectives have no timeout: over the ring backend a peer that exits makes the
next collective raise ("connection to a peer was lost"), but a peer that stops without
closing its sockets (frozen, cut off) makes it block forever. So rank 0 probes: every
``interval`` seconds a ping is posted to the engine's worker thread, where it runs
between steps, after the work already queued, as a round trip through every rank
(:meth:`~.lockstep.LockstepModel.ping`). A ping that raises, or that has not come back
``timeout`` seconds after it was posted, means the group is broken. A busy engine is
no excuse: a step lasts about a second at most (the prefill pacer cuts prompts into
chunks of that size), so a healthy worker runs the ping within a second or two.

Broken, rank 0 stops taking work (``Engine.unavailable``: new requests get a 503
``engine_unavailable``), ends every open request with an error (through the worker when
it still runs; directly when it is stuck inside a collective), gives the responses a
moment to write that error, and exits with status 3.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .group import DistributedGroup

log = logging.getLogger("mlxbun.distributed")

EXIT_STATUS = 3  # a rank was lost
GRACE_S = 1.5  # for the open responses to write their error before the exit


class Watchdog:
    def __init__(self, group: DistributedGroup, ping: Callable[[], float], engine: Any,
                 interval: float = 1.0, timeout: float = 10.0,
                 exit: Callable[[int], None] = os._exit):
        self.group, self._ping, self.engine = group, ping, engine
        self.interval, self.timeout = interval, timeout
        self._exit = exit
        self._posted: float | None = None  # when the ping in flight was posted
        self._dead = threading.Event()
        self._retired = False
        self._thread = threading.Thread(target=self._run, name="mlxbun-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    @property
    def broken(self) -> bool:
        return self._dead.is_set() and not self._retired

    def retire(self) -> None:
        """The group was stopped on purpose: nothing more to watch."""
        self._retired = True

    def _run(self) -> None:
        while not self._dead.is_set() and not self._retired:
            time.sleep(self.interval)
            if self._retired:
                return
            posted = self._posted
            if posted is None:
                self._posted = time.monotonic()
                self.engine.worker.post(self._probe)
            elif time.monotonic() - posted > self.timeout:
                self.lost(f"a rank of the distributed group did not answer for "
                          f"{self.timeout:.0f} s")

    def _probe(self) -> None:
        """On the worker thread: one round trip through every rank."""
        try:
            took = self._ping()
        except Exception as exc:
            return self.lost(f"the distributed group broke: {exc}")
        self.group.last_ping_ms = round(took * 1e3, 2)
        self._posted = None

    def lost(self, reason: str) -> None:
        """The group is broken: refuse new work, fail the open work, exit non-zero."""
        if self._dead.is_set() or self._retired:
            return
        self._dead.set()
        # the exit first: nothing below (a closed stderr, a stuck job) may keep it from us
        threading.Timer(GRACE_S + 0.3, self._exit, args=(EXIT_STATUS,)).start()
        self.group.alive, self.group.problem = False, reason
        message = f"engine unavailable: {reason}"
        with contextlib.suppress(OSError):  # the launcher is gone (a broken pipe)
            print(f"mlxbun: {reason}; ending open requests and exiting", file=sys.stderr,
                  flush=True)
        self.engine.unavailable = message
        self.engine.abort(message)  # the worker ends them, if it still runs
        time.sleep(0.3)
        for job in list(open_jobs(self.engine)):  # it is stuck inside a collective
            try:
                job.close("error", message)
            except Exception:  # the exit must happen whatever a job does
                log.exception("closing a job after the group broke")


def open_jobs(engine: Any) -> Iterator[Any]:
    """Every job a lane holds (running, waiting, the batch lane's lone one), read without
    the worker thread, which may be stuck for good (``Lane.jobs``)."""
    for lane in list(getattr(engine.worker, "lanes", ())):
        yield from lane.jobs()
