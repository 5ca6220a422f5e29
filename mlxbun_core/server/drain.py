"""Graceful shutdown: on SIGINT/SIGTERM stop taking work, finish what runs, exit 0.

New generation and embedding requests get a 503 while draining (and ``/health``
says so); active requests run to their end, then the SSD prompt-cache tier (when
on) is flushed, all bounded by ``MLXBUN_SHUTDOWN_TIMEOUT`` seconds (default 120).
A second signal stops at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import uvicorn

log = logging.getLogger("mlxbun.server")

DEFAULT_TIMEOUT_S = 120.0


def shutdown_timeout() -> float:
    raw = os.environ.get("MLXBUN_SHUTDOWN_TIMEOUT", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        value = DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain between the first signal and the exit."""

    def __init__(self, config: uvicorn.Config, engine, timeout: float | None = None):
        super().__init__(config)
        self.engine = engine
        self.timeout = shutdown_timeout() if timeout is None else timeout

    def handle_exit(self, sig, frame) -> None:
        # not recorded in _captured_signals: uvicorn would re-raise it and the exit
        # status would be the signal's instead of 0
        if self.engine.draining:
            log.warning("second signal: stopping now")
            self.should_exit = self.force_exit = True
            return
        self.engine.draining = True
        log.info("shutting down: draining %d active and %d waiting requests (up to %.0f s)",
                 self.engine.worker.active, self.engine.worker.waiting, self.timeout)
        threading.Thread(target=self._drain, name="mlxbun-drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.engine.idle and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.engine.idle:
            log.warning("shutdown timeout: %d requests still running are cancelled",
                        self.engine.worker.active + self.engine.worker.waiting)
        self._flush_cache(deadline)
        self.should_exit = True

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
                     report["flushedSnapshots"], report["entries"], report["elapsedMs"])  # uvicorn then lets open responses write their last frames
