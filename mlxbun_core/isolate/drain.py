"""The engine child's gate: counts requests in flight and answers ``POST /admin/drain``.

Wraps the child's ASGI app only when it listens on a unix socket (``--unix``), so
``/admin/drain`` never exists on TCP. Draining refuses new work with a 503 and
waits until every in-flight request, streams included, has finished; the parent
then stops the child. There is no SSD prompt-cache tier to demote to yet, so
``demotions`` is 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time

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
    def __init__(self, app, timeout_s: float = DRAIN_TIMEOUT_S):
        self.app, self.timeout_s = app, timeout_s
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == DRAIN_PATH:
            if scope["method"] != "POST":
                return await send_json(send, 405, {"error": {"message": "use POST"}})
            return await send_json(send, 200, await self.drain())
        if self.draining and scope["path"] != "/health":
            return await send_json(send, 503, {"error": {
                "message": "engine is draining", "type": "engine_unavailable"}})
        self.in_flight += 1
        self._idle.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def drain(self) -> dict:
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), self.timeout_s)
            idle = True
        except asyncio.TimeoutError:
            idle = False
            log.warning("drain: %d requests still running after %.0f s", self.in_flight,
                        self.timeout_s)
        return {"drained": idle, "demotions": 0, "in_flight": self.in_flight}


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
