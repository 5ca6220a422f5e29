"""The engine child's gate: ``POST /admin/drain``, on its unix socket only.

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
