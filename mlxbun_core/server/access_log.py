"""One log line for every refused request, at the level a served one gets its line.

A generation that is served logs its own line when it ends (``mlxbun.engine``: tokens,
speed, lane). A request that is refused (a bad body, a wrong route or method, a body
over the cap, a missing key) used to leave no trace; here every answer of 400 or more
gets ``METHOD PATH STATUS · reason`` on ``mlxbun.access`` (INFO for 4xx, WARNING for 5xx;
anything else, and ``/health`` whatever it says, at DEBUG, so ``--log-level debug`` is a
full access log). The reason is the error body's message, cut to a line. The middleware
is the app's outermost, so refusals by the guard are seen too, and a refused WebSocket
handshake as well; the ``--isolate`` parent logs what it answers itself through
:func:`log_answer`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from blacksheep import Application, Request, Response

from . import handshake
from .body import CLIENT_GONE
from .common import Handler

log = logging.getLogger("mlxbun.access")

REASON_MAX = 160
QUIET_PATHS = ("/health",)
HEAD_MARK = "mlxbun.head"
"""Set in the ASGI scope of a HEAD request answered as a GET (:mod:`.head`)."""

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def reason_of(body: bytes | None) -> str:
    """The message of an error body, in a few words (OpenAI's, Anthropic's and the plain
    ``{"message"}`` / ``{"detail"}`` shapes), else its first line."""
    if not body:
        return ""
    text = body[:4096].decode("utf-8", "replace")
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict):
            data = inner
        elif isinstance(inner, str):
            data = {"message": inner}
        found = data.get("message") or data.get("detail") or data.get("status")
        text = found if isinstance(found, str) else text
    first = " ".join(text.split())
    return first if len(first) <= REASON_MAX else first[:REASON_MAX - 1] + "…"


def log_answer(method: str, path: str, status: int, body: bytes | None,
               started: float | None = None) -> None:
    """The access line for one answer (see the module docstring)."""
    level = logging.WARNING if status >= 500 else logging.INFO if status >= 400 \
        else logging.DEBUG
    why = reason_of(body) if status >= 400 else ""
    if path in QUIET_PATHS:  # probes poll it: its 503s (loading, draining) are no refusals
        level = logging.DEBUG
    if why == CLIENT_GONE:  # nobody reads this answer (a flood of them would fill the log)
        level = logging.DEBUG
    if not log.isEnabledFor(level):
        return
    took = f" · {1e3 * (time.perf_counter() - started):.0f} ms" if started else ""
    log.log(level, "%s %s %d%s%s", method, path, status, f" · {why}" if why else "", took)


def method_of(request: Request) -> str:
    scope = getattr(request, "scope", None) or {}
    return "HEAD" if scope.get(HEAD_MARK) else request.method


def install(app: Application) -> None:
    """Add the access log as the outermost middleware (call it after every other
    middleware is in place: it inserts itself first)."""

    async def access_log(request: Request, handler: Handler) -> Response | None:
        started = time.perf_counter()
        path = request.url.path.decode("utf-8", "replace")
        try:
            response: Response | None = await handler(request)
        except Exception:
            log_answer(method_of(request), path, 500, None, started)
            raise
        if response is not None:
            content = response.content
            body = content.body if content is not None and response.status >= 400 else None
            log_answer(method_of(request), path, response.status, body, started)
        else:  # a WebSocket: a refusal answered the handshake itself
            found = handshake.of(getattr(request, "scope", None) or {})
            if found is not None and found.refused is not None:
                log_answer("GET", path, *found.refused, started)
        return response

    # BlackSheep types a middleware as returning a Response; for a WebSocket the handler
    # returns None (see guard.install)
    app.middlewares.insert(0, access_log)  # type: ignore[arg-type]


class RecordingSend:
    """An ASGI ``send`` that remembers the status it started the response with (499: the
    client left before any answer; 500 after :meth:`failed`: the app failed before one)
    and the start of an error's body (its reason). The ``--isolate`` parent answers
    through one."""

    def __init__(self, send: Send):
        self.send, self.code, self.started, self.body = send, 499, False, b""

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.code, self.started = int(message["status"]), True
        elif message["type"] == "http.response.body" and self.code >= 400 \
                and len(self.body) < 4096:
            self.body += bytes(message.get("body", b""))
        await self.send(message)

    def failed(self) -> None:
        if not self.started:
            self.code = 500
