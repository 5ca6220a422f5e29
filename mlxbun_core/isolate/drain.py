"""Draining: the engine child's ``POST /admin/drain`` gate, and the parent's own drain on a
signal (:class:`ParentServer`).

Wraps the child's ASGI app only when it listens on a unix socket (``--unix``), so
``/admin/drain`` never exists on TCP. A drain puts the engine in the same
draining state as a shutdown signal (new generation work gets a 503) and waits
until the engine is idle and every HTTP response in flight, streams included,
has been written, then demotes the whole prompt cache to the SSD tier (when
``--ssd-cache`` is on: every entry is written and its RAM freed; ``demotions`` counts
them), so a later engine for this model restores it; the parent then stops the child.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time

import uvicorn

from ..server.drain import shutdown_timeout

log = logging.getLogger("mlxbun.isolate")

DRAIN_PATH = "/admin/drain"
DRAIN_TIMEOUT_S = 60.0


async def send_json(send, status: int, obj, headers=()) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class DrainGate:
    def __init__(self, app, engine=None, timeout_s: float = DRAIN_TIMEOUT_S):
        self.app, self.engine, self.timeout_s = app, engine, timeout_s
        self.in_flight = 0  # HTTP requests whose response is still being written

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == DRAIN_PATH:
            if scope["method"] != "POST":
                return await send_json(send, 405, {"error": {"message": "use POST"}})
            return await send_json(send, 200, await self.drain())
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _idle(self) -> bool:
        return self.in_flight == 0 and (self.engine is None or self.engine.idle)

    async def drain(self) -> dict:
        if self.engine is not None:
            self.engine.draining = True
        deadline = time.monotonic() + self.timeout_s
        while not self._idle() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if not self._idle():
            log.warning("drain: %d responses still open after %.0f s", self.in_flight,
                        self.timeout_s)
        demotions = 0
        if self.engine is not None:
            from ..kvstore.durability import demote

            try:
                demotions = await demote(self.engine, self.timeout_s)
            except Exception:  # a drain must finish whatever the disk does
                log.exception("drain: demoting the prompt cache failed")
        return {"drained": self._idle(), "demotions": demotions, "in_flight": self.in_flight}


def exit_with_parent(poll_s: float = 1.0) -> None:
    """End this engine child when the parent that started it is gone (even SIGKILLed):
    an orphaned engine would hold its model's memory for nobody."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("parent %d is gone; engine exiting", parent)
        os._exit(0)

    threading.Thread(target=watch, name="mlxbun-parent-watch", daemon=True).start()



class ParentServer(uvicorn.Server):
    """uvicorn's server for the ``--isolate`` parent, with the in-process server's drain
    between the first signal and the exit: ``/health`` answers 503 ``draining`` and new
    generation requests a 503 while the requests being proxied run to their end (bounded
    by ``MLXBUN_SHUTDOWN_TIMEOUT``); then the parent stops its engines. (Plain uvicorn
    closes the listening socket at once: a load balancer's health check was refused
    instead of told.) A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, app, timeout: float | None = None):
        super().__init__(config)
        self.app = app  # the ParentApp: .draining, .begin_drain(), .busy
        self.drain_timeout = shutdown_timeout() if timeout is None else timeout

    def handle_exit(self, sig, frame) -> None:
        # not recorded in _captured_signals: uvicorn would re-raise it and the exit
        # status would be the signal's instead of 0
        if self.app.draining:
            log.warning("second signal: stopping now")
            self.should_exit = self.force_exit = True
            return
        self.app.begin_drain()
        log.info("shutting down: draining %d proxied requests (up to %.0f s)", self.app.busy,
                 self.drain_timeout)
        threading.Thread(target=self._drain, name="mlxbun-drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.app.busy and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.app.busy:
            log.warning("shutdown timeout: %d proxied requests are cut", self.app.busy)
        self.should_exit = True
