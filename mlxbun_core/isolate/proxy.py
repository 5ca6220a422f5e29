"""Forward one HTTP request to an engine child over its unix socket (httpx), ASGI side raw.

Hop-by-hop headers are dropped, SSE and every other body stream through as the
child writes them, and a client disconnect closes the upstream connection so the
child sees its own disconnect and frees the request's slot. A child that dies
mid-request answers ``502 engine_unavailable`` (or, once a stream has started, a
final SSE ``error`` event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

import httpx

from ..errors import RESTARTING_HEADER
from .access import forwarded
from .child import EngineProcess
from .drain import send_json

log = logging.getLogger("mlxbun.isolate")

HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
              b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host",
              b"content-length"}


class EngineGone(Exception):
    """The engine dropped the request before answering; nothing was sent to the client."""


class EngineRestarting(Exception):
    """The engine's device failed: it answered 503 (``RESTARTING_HEADER``) without running
    the request and is about to exit; nothing was sent to the client. ``pid``: the engine
    process that said so; ``status``, ``headers``, ``body``: its answer, to send if the
    request is not tried again."""

    def __init__(self, pid: int | None, status: int, headers: list, body: bytes):
        super().__init__("the engine is restarting")
        self.pid, self.status, self.headers, self.body = pid, status, headers, body

    async def send(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status,
                    "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def unavailable_body(message: str) -> dict:
    return {"error": {"message": message, "type": "engine_unavailable"}}


async def send_unavailable(send, message: str) -> None:
    await send_json(send, 502, unavailable_body(message))


class Disconnect:
    """Watches ``receive`` for ``http.disconnect`` (the body has been read already)."""

    def __init__(self, receive):
        self.event = asyncio.Event()
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive):
        while True:
            msg = await receive()
            if msg.get("type") == "http.disconnect":
                self.event.set()
                return

    def close(self):
        self._task.cancel()


async def _race(work: Awaitable, disconnect: Disconnect):
    """Run ``work``; None (and ``work`` cancelled) if the client leaves first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnect.event.wait())
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return None


def _request(engine: EngineProcess, scope, body: bytes) -> httpx.Request:
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
    # the path the guard checked (access.prepare), sent as it is: an absolute URL, so
    # httpx never reads a leading //x as a host
    target = forwarded(scope.get("raw_path") or scope["path"].encode(),
                       scope.get("query_string") or b"")
    return engine.client.build_request(scope["method"], target, headers=headers, content=body)


async def forward(engine: EngineProcess, scope, body: bytes, receive, send,
                  on_response: Callable[[httpx.Response], object] | None = None) -> int:
    """Proxy one request; returns the status sent (499: the client left first).
    Raises :class:`EngineGone` when the engine fails before answering (nothing sent yet).

    ``on_response(resp)`` may return a chunk observer ``f(bytes)`` (the parent's
    response store reads finished Responses this way).
    """
    disconnect = Disconnect(receive)
    pid = engine.proc.pid if engine.proc is not None else None
    try:
        try:
            resp = await _race(engine.client.send(_request(engine, scope, body), stream=True),
                               disconnect)
        except httpx.TransportError as exc:
            raise EngineGone(f"engine {engine.model_id} is unavailable: "
                             f"{type(exc).__name__}") from exc
        if resp is None:
            return 499
        try:
            headers = [(k, v) for k, v in resp.headers.raw if k.lower() not in HOP_BY_HOP]
            if resp.status_code == 503 and resp.headers.get(RESTARTING_HEADER):
                raise EngineRestarting(pid, 503, headers, await resp.aread())
            observe = on_response(resp) if on_response else None
            await send({"type": "http.response.start", "status": resp.status_code,
                        "headers": headers})
            ok = await _race(_pump(resp, send, observe), disconnect)
            if ok is None:
                return 499
            if ok and hasattr(observe, "close"):
                observe.close()
            streamed = resp.headers.get("content-type", "").startswith("text/event-stream")
            if ok is False and streamed:  # the engine died mid-stream: say so in the stream
                err = unavailable_body(f"engine {engine.model_id} stopped mid-stream")
                await send({"type": "http.response.body", "more_body": True,
                            "body": b"event: error\ndata: " + json.dumps(err).encode()
                                    + b"\n\n"})
            await send({"type": "http.response.body", "body": b""})
            return resp.status_code
        finally:
            await resp.aclose()  # closes the upstream connection when unread: the child sees it
    finally:
        disconnect.close()


async def _pump(resp: httpx.Response, send, observe) -> bool:
    try:
        async for chunk in resp.aiter_raw():
            if observe is not None:
                observe(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.TransportError:
        return False
    return True
