"""Shutdown on SIGINT/SIGTERM: drain, or on a second signal stop at once, cleanly.

- First signal: stop taking work (new generation and embedding requests get a 503 and
  ``/health`` says so), let active requests run to their end, bounded by
  ``MLXBUN_SHUTDOWN_TIMEOUT`` seconds (default 120), then flush the SSD
  prompt-cache tier (when on) and exit 0. Requests still
  running at the timeout end with an error event.
- Second signal: every open request ends now with an error event in its own
  surface's shape (the streams are closed properly, not cut), one line goes to the
  log, and the process exits with 128 + the signal number (130 for Ctrl-C).
- Third signal: exit at once with that status, whatever is still open.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from ..runconfig import current

if TYPE_CHECKING:
    from ..engine.core import Engine

log = logging.getLogger("mlxbun.server")

DEFAULT_TIMEOUT_S = 120.0
ABORT_GRACE_S = 5.0  # after a second signal: time for open responses to write their error
# the device failed for good: ``sysexits.h``'s EX_TEMPFAIL, "try again later": a supervisor
# (systemd's Restart=on-failure, launchd's KeepAlive, a container's restart policy, the
# ``--isolate`` parent) starts the server again
DEVICE_FAULT_EXIT = 75
FAULT_LINGER_S = 1.0  # once every request was answered, /health keeps saying 503 this long
FAULT_EXIT_AFTER_S = 15.0  # the exit happens by then, whatever is still open


def shutdown_timeout() -> float:
    return current().server.shutdown_timeout or DEFAULT_TIMEOUT_S


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain between the first signal and the exit.

    ``exit_code`` is what the process should exit with once ``run`` returns.
    """

    def __init__(self, config: uvicorn.Config, engine: Engine, timeout: float | None = None):
        super().__init__(config)
        self.engine = engine
        self.timeout = shutdown_timeout() if timeout is None else timeout
        self.exit_code = 0
        self.signalled = False  # a first signal came (an /admin/drain alone is not one)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # not recorded in _captured_signals: uvicorn would re-raise it and the exit
        # status would be the signal's default action instead of ours
        if self.exit_code:
            print(f"mlxbun: signal {sig} again: exiting now", file=sys.stderr, flush=True)
            os._exit(self.exit_code)
        if self.signalled:
            self.exit_code = 128 + int(sig)
            log.warning("second signal: ending %d open requests with an error, then exiting",
                        self.engine.worker.active + self.engine.worker.waiting)
            self._stop("server stopped by a second shutdown signal")
            return
        self.signalled = self.engine.draining = True
        log.info("shutting down: draining %d active and %d waiting requests (up to %.0f s)",
                 self.engine.worker.active, self.engine.worker.waiting, self.timeout)
        threading.Thread(target=self._drain, name="mlxbun-drain", daemon=True).start()

    def fault(self, reason: str) -> None:
        """The device failed for good (the engine already ended every request with a 503
        to send again): let the responses write it, then exit ``DEVICE_FAULT_EXIT``."""
        if self.exit_code == DEVICE_FAULT_EXIT:
            return
        self.exit_code = DEVICE_FAULT_EXIT
        print(f"mlxbun: device fault ({reason}); /health says 503, open requests end, and "
              f"the server exits with status {DEVICE_FAULT_EXIT} for its supervisor to "
              "restart it", file=sys.stderr, flush=True)
        # nothing may keep the exit from us: no teardown touches the failed device
        threading.Timer(FAULT_EXIT_AFTER_S, os._exit, args=(DEVICE_FAULT_EXIT,)).start()
        threading.Thread(target=self._after_fault, name="mlxbun-fault", daemon=True).start()

    def _after_fault(self) -> None:
        """Answer what is open (each request a 503 to send again, or its stream's error
        event) and say 503 on ``/health`` a moment longer, then stop serving."""
        deadline = time.monotonic() + ABORT_GRACE_S
        while not self.engine.idle and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(FAULT_LINGER_S)
        self._grace(ABORT_GRACE_S)
        self.should_exit = True

    def _stop(self, message: str) -> None:
        """End every request with ``message`` and let the responses write it."""
        self.engine.abort(message)
        self._grace(min(self.config.timeout_graceful_shutdown or ABORT_GRACE_S, ABORT_GRACE_S))
        self.should_exit = True

    def _grace(self, seconds: float) -> None:
        """How long uvicorn lets open responses finish once it stops."""
        # uvicorn annotates an int; it only hands the value to asyncio.wait_for
        self.config.timeout_graceful_shutdown = seconds  # type: ignore[assignment]

    def _drain(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.engine.idle and time.monotonic() < deadline:
            if self.should_exit:
                return  # a second signal took over
            time.sleep(0.05)
        if not self.engine.idle:
            log.warning("shutdown timeout: %d requests still running end with an error",
                        self.engine.worker.active + self.engine.worker.waiting)
            return self._stop("server shut down: the shutdown timeout ran out")
        self._flush_cache(deadline)
        self.should_exit = True  # uvicorn then lets open responses write their last frames

    def _flush_cache(self, deadline: float) -> None:
        from ..kvstore.durability import flush_blocking

        try:
            report = flush_blocking(self.engine, max(1.0, deadline - time.monotonic()))
        except Exception:  # the exit must happen whatever the disk does
            log.exception("shutdown: ssd cache flush failed")
            return
        if report is not None:
            log.info("shutdown: ssd cache %s (%d written, %d entries on disk, %d ms)",
                     "flushed" if report["durable"] else "NOT fully flushed",
                     report["flushedSnapshots"], report["entries"], report["elapsedMs"])
