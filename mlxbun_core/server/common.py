"""Helpers every surface shares: JSON bodies, error rendering, SSE, disconnects."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol

from blacksheep import Request, Response, Router
from blacksheep.contents import Content, StreamedContent

from ..errors import APIError
from .body import read_body as read_body  # the surfaces' way in

log = logging.getLogger("mlxbun.server")

Handler = Callable[[Request], Awaitable[Response]]
"""A BlackSheep request handler."""


class Cancellable(Protocol):
    """What a disconnect stops: a generation, or the choices of one request."""

    def cancel(self) -> None: ...


HEADER_VALUE_MAX = 1024


def header_value(text: str) -> bytes:
    """``text`` as a header value every client reads: printable ASCII, anything else
    escaped (a Warning can quote the client's own schema; a control character would
    make the server drop the connection), capped in length."""
    safe = "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii")
                   for c in text)
    if len(safe) > HEADER_VALUE_MAX:
        safe = safe[:HEADER_VALUE_MAX - 3] + "..."
    return safe.encode("ascii")


def add_headers(resp: Response, headers: Mapping[str, str] | None) -> None:
    for k, v in (headers or {}).items():
        resp.add_header(k.encode(), header_value(v))


def json_response(data: object, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    resp = Response(status, None, Content(b"application/json", body))
    add_headers(resp, headers)
    return resp


def openai_error(exc: APIError) -> Response:
    return json_response(exc.body(), exc.status)


def as_api_error(exc: Exception) -> APIError:
    """Client mistakes keep their status; anything else is a 500 with the message only."""
    if isinstance(exc, APIError):
        return exc
    log.error("request failed", exc_info=exc)
    return APIError(str(exc) or type(exc).__name__)


def guarded(render: Callable[[APIError], Response] = openai_error) -> Callable[[Handler], Handler]:
    """Decorator: turn exceptions raised before a response starts into ``render``."""

    def wrap(handler: Handler) -> Handler:
        async def inner(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                err = as_api_error(exc)
                resp = render(err)
                add_headers(resp, err.headers())  # Retry-After on a 503
                return resp

        inner.__name__ = handler.__name__
        return inner

    return wrap


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(router: Router, path: bytes) -> list[str]:
    """The HTTP methods some route serves ``path`` with (empty: no route has it)."""
    found = set()
    for method, routes in router.routes.items():
        name = method.decode() if isinstance(method, bytes) else str(method)
        if name in HTTP_METHODS and any(r.match_by_path(path) for r in routes):
            found.add(name)
    return sorted(found, key=HTTP_METHODS.index)


def method_not_allowed(method: str, path: str, allowed: list[str],
                       render: Callable[[APIError], Response] = openai_error) -> Response:
    """405 in the route's own error shape, with the ``Allow`` header HTTP asks for."""
    exc = APIError(f"{method} is not allowed on {path}: use {' or '.join(allowed)}",
                   status=405, type="invalid_request_error", code="method_not_allowed")
    resp = render(exc)
    resp.add_header(b"Allow", ", ".join(allowed).encode())
    return resp


def route_param(request: Request, name: str) -> str:
    """The ``{name}`` segment of the matched route (BlackSheep types route values
    optional; a matched segment is always there)."""
    return request.route_values.get(name) or ""


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def sse_data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_event(name: str, obj: object) -> bytes:
    return (f"event: {name}\n".encode() + b"data: "
            + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")


KEEPALIVE = b": keep-alive\n\n"


def watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> asyncio.Task[None]:
    """Call ``on_disconnect`` when the client goes away.

    uvicorn silently drops writes to a closed connection, so a streaming loop
    would otherwise run to the end; the ASGI ``http.disconnect`` message is the
    reliable signal. The body has been read already, so ``receive`` blocks until then.
    """
    receive = getattr(request.content, "receive", None)

    async def wait() -> None:
        if receive is None:
            return
        while True:
            msg = await receive()
            if msg.get("type") == "http.disconnect":
                on_disconnect()
                return

    return asyncio.ensure_future(wait())


def sse_response(request: Request, gen: Cancellable, frames: AsyncIterator[bytes],
                 headers: Mapping[str, str] | None = None) -> Response:
    """Stream ``frames`` as SSE; a disconnect cancels ``gen`` within one decode step."""

    async def provider() -> AsyncIterator[bytes]:
        watcher = watch_disconnect(request, gen.cancel)
        try:
            async for frame in frames:
                yield frame
        finally:
            watcher.cancel()
            gen.cancel()

    resp = Response(200, None, StreamedContent(b"text/event-stream", provider))
    resp.add_header(b"Cache-Control", b"no-cache")
    resp.add_header(b"X-Accel-Buffering", b"no")
    add_headers(resp, headers)
    return resp
