"""Who may use the ``--isolate`` parent: the serve guard's rules on the parent's TCP side
(the engines behind the socket see only the parent, and trust what it forwards).

The parent has no router, so it decides on the exact path it forwards, read the way the
engine's router reads it. :func:`prepare` first puts the path in the form the proxy sends
(httpx removes dot segments: ``/v1/../admin/cache/flush`` arrives as
``/admin/cache/flush``), so what is checked is what is sent; :func:`route_key` then reads
it as BlackSheep does (:func:`~mlxbun_core.server.guard.route_key`).
"""

from __future__ import annotations

import json
from urllib.parse import unquote

import httpx

from ..server import guard
from ..server.access_log import log_answer
from ..server.guard import Answer, GuardRules
from ..server.origin import CorsRules
from ..webapp import pages as web

# answer without the API key: the page's static shell and the Curve Designer's pages
OPEN_PATHS = guard.OPEN_PATHS + web.open_paths() + tuple(web.CURVE_PAGES)
ENGINE = httpx.URL("http://engine")  # the engines' unix sockets: the host is a label


def rules(api_key: str | None, cors: CorsRules | None = None) -> GuardRules:
    """The serve guard's rules as the parent applies them."""
    return GuardRules(api_key=api_key, open_paths=OPEN_PATHS, cors=cors or CorsRules())


def forwarded(raw_path: bytes, query: bytes = b"") -> httpx.URL:
    """The URL the proxy sends for this path: absolute, so httpx never reads a leading
    ``//x`` as a host; dot segments removed, as httpx always does."""
    url = ENGINE.copy_with(raw_path=raw_path)
    return url.copy_with(query=query) if query else url


def prepare(scope) -> str:
    """Rewrite ``scope``'s path to the one the proxy forwards; returns its route key."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = forwarded(raw).raw_path
    scope["raw_path"], scope["path"] = path, unquote(path.decode("latin-1"))
    return guard.route_key(path)


def check(scope, key: str, parent_rules: GuardRules) -> Answer | None:
    """The guard's answer (a refusal or a CORS preflight), or None to go on. Errors take
    the Anthropic shape on /v1/messages."""
    return guard.decide(scope, key, parent_rules)


log_refusal = guard.log_refusal


async def send_answer(send, scope, key: str, answer: Answer, parent_rules: GuardRules) -> None:
    """The guard's answer as ASGI messages (a refusal read by a ``--cors`` site's page
    carries its CORS headers, as any answer does)."""
    log_refusal(scope, answer)
    body = b"" if answer.body is None else json.dumps(answer.body).encode()
    headers = list(answer.headers)
    if answer.status >= 400:
        headers += guard.cors_headers(scope, key, parent_rules)
    if answer.body is not None:
        headers.append((b"content-type", b"application/json"))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def with_cors(send, scope, key: str, parent_rules: GuardRules):
    """``send`` adding the CORS headers of a site ``--cors`` allows to the answer."""
    extra = guard.cors_headers(scope, key, parent_rules)
    if not extra:
        return send

    async def sending(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


async def refuse_websocket(scope, send, parent_rules: GuardRules, no_chat: str) -> None:
    """A WebSocket handshake at the parent, which hosts no socket: the guard's refusal, else
    501 on the chat's path (the chat needs an in-process engine) and 404 elsewhere, as
    HTTP where the server can answer an upgrade so; else the socket is closed."""
    key = prepare(scope)
    answer = check(scope, key, parent_rules)
    if answer is not None:
        log_refusal(scope, answer)
        status, body = answer.status, answer.body
    elif key == "/ws/chat":
        status, body = 501, {"error": {"message": no_chat, "type": "not_implemented"}}
    else:
        status, body = 404, {"error": {"message": f"no WebSocket at {scope['path']}",
                                       "type": "not_found_error"}}
    if answer is None:  # (the guard's refusals are logged by log_refusal)
        log_answer("GET", scope["path"], status, json.dumps(body).encode())
    if "websocket.http.response" not in scope.get("extensions", {}):
        return await send({"type": "websocket.close", "code": 1008})
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "websocket.http.response.body", "body": json.dumps(body or {}).encode()})
