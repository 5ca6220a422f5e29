"""Who may call what, in one place (a middleware), not a check per route.

- ``--api-key KEY`` (or ``MLXBUN_API_KEY``): every route except ``GET /health`` and
  the web app's static shell (``app.state.guard.open_route``) requires ``Authorization:
  Bearer KEY`` (OpenAI clients) or ``x-api-key: KEY`` (Anthropic clients); anything
  else is a 401.
- Admin routes (those that read or write the filesystem, start jobs or hold the chat:
  paths under the prefixes in ``ADMIN_PREFIXES`` plus any a module adds with
  ``app.state.guard.admin_route``) answer loopback clients only, unless an API key is
  configured (then the key is what authorizes). A remote client gets a 403.
- Browsers: a page of another site may not send state-changing requests or open the
  chat's socket, and a loopback client must name this machine in ``Host``
  (:mod:`.origin`; ``--cors`` names the sites the user trusts).

Every decision is made on the route the request reaches (the router's own match), never
on how its path is spelled: BlackSheep matches routes regardless of letter case and with
or without a trailing slash, so ``/API/jobs`` is ``/api/jobs``. The ``--isolate`` parent,
which has no router, decides on the exact path it forwards (:mod:`..isolate.access`).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qs

from blacksheep import Application, Request, Response
from blacksheep.server.websocket import WebSocket

from . import handshake, origin
from .common import Handler, json_response
from .origin import CorsRules

log = logging.getLogger("mlxbun.guard")

ADMIN_PREFIXES = ("/api/", "/admin/", "/v1/adapters", "/v1/memory", "/ws/chat")
OPEN_PATHS = ("/health",)
LOOPBACK_ONLY = ("this route answers loopback clients only; start the server with --api-key "
                 "to allow remote clients")
UNAUTHORIZED = "invalid or missing API key (send Authorization: Bearer <key>)"
Scope = Mapping[str, Any]  # an ASGI scope, read only


@dataclass
class GuardRules:
    """The guard's rules for one app (``AppState.guard``): the API key, if any; the
    admin prefixes (loopback only without a key); the paths open without the key; the
    sites ``--cors`` trusts."""

    api_key: str | None = None
    admin_prefixes: tuple[str, ...] = ADMIN_PREFIXES
    open_paths: tuple[str, ...] = OPEN_PATHS
    cors: CorsRules = field(default_factory=CorsRules)

    def admin_route(self, prefix: str) -> None:
        """Mark every path under ``prefix`` as an admin route."""
        self.admin_prefixes = self.admin_prefixes + (prefix.lower(),)

    def open_route(self, path: str) -> None:
        """Let ``path`` (every path under it when it ends in ``/*``) answer without the
        API key: static files that hold nothing private, such as the web app's shell."""
        self.open_paths = self.open_paths + (path,)

    def is_admin(self, route: str) -> bool:
        """Whether ``route`` (a route pattern, or a path as a router reads it) is an
        admin route."""
        return route.lower().startswith(self.admin_prefixes)


@dataclass(frozen=True)
class Answer:
    """What the guard answers instead of the route: a refusal or a CORS preflight."""

    status: int
    body: dict[str, Any] | None
    headers: list[tuple[bytes, bytes]]
    reason: str = ""  # for the log: why a browser's request was refused


def is_loopback(request: Request) -> bool:
    """True for 127.0.0.0/8, ::1 (IPv4-mapped too) and unix-socket clients."""
    return is_loopback_client(request.scope.get("client"))


def is_loopback_client(ip: tuple[str, int] | None) -> bool:
    """:func:`is_loopback` for an ASGI scope's ``client``."""
    if not ip:  # a unix socket: the isolation parent on this machine
        return True
    try:
        addr = ipaddress.ip_address(ip[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def error_body(kind: str, message: str, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind}}


def presented_key(headers: Mapping[bytes, bytes]) -> str | None:
    """The key a request sent: ``Authorization: Bearer`` or ``x-api-key``."""
    auth = headers.get(b"authorization")
    if auth and auth[:7].lower() == b"bearer ":
        return auth[7:].decode("latin-1").strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key else None


def is_open(path: str, open_paths: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``open_paths`` (or under one ending in ``/*``)."""
    return any(path == p or (p.endswith("/*") and path.startswith(p[:-1])) for p in open_paths)


def _query_key(scope: Scope) -> str | None:
    """``?api_key=`` of a WebSocket handshake (browsers cannot set its headers)."""
    raw = scope.get("query_string") or b""
    keys = parse_qs(raw.decode("latin-1")).get("api_key")
    return keys[0] if keys else None


def _text(headers: Mapping[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return value.decode("latin-1") if value is not None else None


def _browser_check(scope: Scope, headers: Mapping[bytes, bytes], api_route: bool,
                   rules: GuardRules) -> Answer | None:
    """The ``Host``, preflight and ``Origin`` checks (:mod:`.origin`)."""
    websocket = scope["type"] == "websocket"
    method = "GET" if websocket else str(scope.get("method", "GET"))
    host, sent = _text(headers, b"host"), _text(headers, b"origin")
    scheme = str(scope.get("scheme") or "http")
    if is_loopback_client(scope.get("client")):
        why = origin.host_refusal(host, scheme, rules.cors)
        if why is not None:
            return Answer(403, None, [], why)
    if method == "OPTIONS" and sent is not None and b"access-control-request-method" in headers:
        allowed = origin.preflight_headers(sent, _text(headers, b"access-control-request-headers"),
                                           rules.cors, api_route)
        if allowed is not None:
            return Answer(204, None, allowed)
        return Answer(403, None, [], f"Origin {sent!r} is not allowed (start the server with "
                                     f"--cors {sent} to trust that site)")
    own = sent is not None and origin.own_origin(sent, host, scheme)
    why = origin.cross_site(sent, _text(headers, b"sec-fetch-site"), own,
                            unsafe=websocket or method in origin.UNSAFE_METHODS,
                            api_route=api_route, cors=rules.cors)
    return Answer(403, None, [], why) if why is not None else None


def route_key(path: bytes | str) -> str:
    """A path as BlackSheep's router compares it with route patterns: letter case and one
    trailing slash ignored (percent escapes stay: HTTP routes match the raw path)."""
    key = (path.decode("latin-1") if isinstance(path, bytes) else path).lower()
    return key[:-1] if len(key) > 1 and key.endswith("/") else key


def decide(scope: Scope, route: str, rules: GuardRules) -> Answer | None:
    """The guard's answer to a request (an ASGI ``scope``) that reaches ``route`` (the
    matched route's pattern; for a path no route takes, its :func:`route_key`, so an
    admin-looking path is refused before it is found missing), or None to let it
    through."""
    headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
    anthropic = route.lower().startswith("/v1/messages")
    api_route = not rules.is_admin(route)
    if scope.get("client") is not None:  # a unix socket: the --isolate parent checked these
        answer = _browser_check(scope, headers, api_route, rules)
        if answer is not None:
            if answer.body is None and answer.status >= 400:
                body = error_body("permission_error", answer.reason, anthropic)
                answer = Answer(answer.status, body, answer.headers, answer.reason)
            return answer
    expected = rules.api_key
    if expected is not None and not is_open(route, rules.open_paths):
        got = _query_key(scope) if scope["type"] == "websocket" else None
        got = got if got is not None else presented_key(headers)
        if got is None or not hmac.compare_digest(got.encode(), expected.encode()):
            return Answer(401, error_body("authentication_error", UNAUTHORIZED, anthropic), [])
    elif not api_route and not is_loopback_client(scope.get("client")):
        return Answer(403, error_body("permission_error", LOOPBACK_ONLY, anthropic), [])
    return None


def cors_headers(scope: Scope, route: str, rules: GuardRules) -> list[tuple[bytes, bytes]]:
    """CORS headers for an answer to a page of a site ``--cors`` allows (else none)."""
    sent = _text(dict(scope.get("headers") or []), b"origin")
    if sent is None or not (rules.cors.sites or rules.cors.wildcard):
        return []
    return origin.cors_headers(sent, rules.cors, not rules.is_admin(route))


def log_refusal(scope: Scope, answer: Answer) -> None:
    """One line for a browser request refused by ``Host`` or ``Origin``."""
    if answer.reason and answer.status >= 400:
        client = scope.get("client") or ("unix", 0)
        method = "WS" if scope["type"] == "websocket" else scope.get("method")
        log.info("refused %s %s from %s: %s", method, scope.get("path"), client[0],
                 answer.reason)


def response_of(answer: Answer) -> Response:
    if answer.body is None:
        resp = Response(answer.status, None, None)
    else:
        resp = json_response(answer.body, answer.status)
    for name, value in answer.headers:
        resp.add_header(name, value)
    return resp


async def deny_websocket(ws: WebSocket, response: Response) -> None:
    """Answer a WebSocket handshake with ``response`` (its status and body) instead of
    upgrading (:mod:`.handshake`); a server without that extension gets a close (it then
    answers 403)."""
    found = handshake.of(ws.scope)
    body = response.content.body if response.content else b""
    if found is None or not await found.deny(response.status, body):
        await ws.close()


def matched_route(app: Application, request: Request) -> str | None:
    """The pattern of the route BlackSheep hands ``request`` to (None: its fallback). A
    WebSocket is routed by the scope's decoded path, an HTTP request by its raw path."""
    scope = request.scope
    if scope["type"] == "websocket":
        path = str(scope["path"])
        root = str(scope.get("root_path") or "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        match = app.router.get_match_by_method_and_path("GET_WS", path)
    else:
        match = app.router.get_match(request)
    if match is None or match.pattern == b"*":
        return None
    return match.pattern.decode()


def no_socket(path: str) -> Response:
    return json_response({"error": {"message": f"no WebSocket at {path} (the web chat's is "
                                    "/ws/chat)", "type": "not_found_error"}}, 404)


def install(app: Application, rules: GuardRules) -> None:
    """Add the guard middleware to ``app`` (first, so nothing runs before it). It reads
    ``rules`` on every request, so routes marked after this still count.

    BlackSheep runs middlewares for WebSocket routes too (its fallback included); a
    refused handshake is answered with the same status and body, an upgrade to a path
    without a socket with a 404.
    """

    async def guard(request: Request, handler: Handler) -> Response | None:
        scope = request.scope
        route = matched_route(app, request)
        key = route if route is not None else route_key(
            scope["raw_path"] if scope["type"] == "http" else scope["path"])
        answer = decide(scope, key, rules)
        if scope["type"] == "websocket":  # BlackSheep hands its middlewares the WebSocket
            if answer is not None:
                log_refusal(scope, answer)
                await deny_websocket(cast(WebSocket, request), response_of(answer))
                return None
            if route is None:
                await deny_websocket(cast(WebSocket, request), no_socket(str(scope["path"])))
                return None
            return await handler(request)
        if answer is not None:
            log_refusal(scope, answer)
            response = response_of(answer)
        else:
            response = await handler(request)
        if answer is None or answer.status >= 400:  # a --cors site's page reads its 401 too
            for name, value in cors_headers(scope, key, rules):
                response.add_header(name, value)
        return response

    # BlackSheep types a middleware as returning a Response; for a WebSocket this one has
    # answered the handshake itself and returns None
    app.middlewares.insert(0, guard)  # type: ignore[arg-type]
