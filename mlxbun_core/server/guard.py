"""Who may call what, in one place (a middleware), not a check per route.

- ``--api-key KEY`` (or ``MLXBUN_API_KEY``): every route except ``GET /health`` and
  the web app's static shell (``app.state.guard.open_route``) requires ``Authorization:
  Bearer KEY`` (OpenAI clients) or ``x-api-key: KEY`` (Anthropic clients); anything
  else is a 401.
- Admin routes (those that read or write the filesystem or start jobs: paths
  under the prefixes in ``ADMIN_PREFIXES`` plus any a module adds with
  ``app.state.guard.admin_route``) answer loopback clients only, unless an API key is
  configured (then the key is what authorizes). A remote client gets a 403.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from blacksheep import Application, Request, Response
from blacksheep.server.websocket import WebSocket

from .common import Handler, json_response

ADMIN_PREFIXES = ("/api/", "/admin/", "/v1/adapters")
OPEN_PATHS = ("/health",)
LOOPBACK_ONLY = ("this route answers loopback clients only; start the server with --api-key "
                 "to allow remote clients")


@dataclass
class GuardRules:
    """The guard's rules for one app (``AppState.guard``): the API key, if any; the
    admin prefixes (loopback only without a key); the paths open without the key."""

    api_key: str | None = None
    admin_prefixes: tuple[str, ...] = ADMIN_PREFIXES
    open_paths: tuple[str, ...] = OPEN_PATHS

    def admin_route(self, prefix: str) -> None:
        """Mark every path under ``prefix`` as an admin route."""
        self.admin_prefixes = self.admin_prefixes + (prefix,)

    def open_route(self, path: str) -> None:
        """Let ``path`` (every path under it when it ends in ``/*``) answer without the
        API key: static files that hold nothing private, such as the web app's shell."""
        self.open_paths = self.open_paths + (path,)


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


def _error(status: int, kind: str, message: str, anthropic: bool) -> Response:
    if anthropic:
        return json_response({"type": "error", "error": {"type": kind, "message": message}}, status)
    return json_response({"error": {"message": message, "type": kind}}, status)


def _presented_key(request: Request) -> str | None:
    auth = request.get_first_header(b"authorization")
    if auth and auth[:7].lower() == b"bearer ":
        return auth[7:].decode("latin-1").strip()
    key = request.get_first_header(b"x-api-key")
    return key.decode("latin-1").strip() if key else None


def is_open(path: str, open_paths: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``open_paths`` (or under one ending in ``/*``)."""
    return any(path == p or (p.endswith("/*") and path.startswith(p[:-1])) for p in open_paths)


async def deny_websocket(ws: WebSocket, response: Response) -> None:
    """Answer a WebSocket handshake with ``response`` (its status and body) instead of
    upgrading (ASGI's ``websocket.http.response`` extension, which uvicorn has)."""
    extensions = ws.scope.get("extensions") or {}
    if not isinstance(extensions, dict) or "websocket.http.response" not in extensions:
        await ws.close()  # the server then answers 403
        return
    body = response.content.body if response.content else b""
    await ws._send({"type": "websocket.http.response.start", "status": response.status,
                    "headers": [(b"content-type", b"application/json")]})
    await ws._send({"type": "websocket.http.response.body", "body": body})


def _is_websocket(request: Request) -> bool:
    return (getattr(request, "scope", None) or {}).get("type") == "websocket"


def install(app: Application, rules: GuardRules) -> None:
    """Add the guard middleware to ``app`` (first, so nothing runs before it). It reads
    ``rules`` on every request, so routes marked after this still count.

    BlackSheep runs middlewares for WebSocket routes too; a refused handshake is
    answered with the same status and body. Browsers cannot set headers on a
    WebSocket, so there the key may also come as ``?api_key=``.
    """
    expected = rules.api_key.encode() if rules.api_key else None

    def check(request: Request, key: str | None) -> Response | None:
        path = request.path
        anthropic = path.startswith("/v1/messages")
        if expected is not None and not is_open(path, rules.open_paths):
            got = key if key is not None else _presented_key(request)
            if got is None or not hmac.compare_digest(got.encode(), expected):
                return _error(401, "authentication_error", "invalid or missing API key "
                              "(send Authorization: Bearer <key>)", anthropic)
        elif path.startswith(rules.admin_prefixes) and not is_loopback(request):
            return _error(403, "permission_error", LOOPBACK_ONLY, anthropic)
        return None

    async def guard(request: Request, handler: Handler) -> Response | None:
        websocket = _is_websocket(request)
        keys = request.query.get("api_key") if websocket else None
        key = keys[0] if keys else None
        refusal = check(request, key)
        if refusal is None:
            return await handler(request)
        if websocket:  # BlackSheep hands a WebSocket scope's middlewares its WebSocket
            await deny_websocket(cast(WebSocket, request), refusal)
            return None
        return refusal

    # BlackSheep types a middleware as returning a Response; for a WebSocket this one has
    # answered the handshake itself and returns None
    app.middlewares.insert(0, guard)  # type: ignore[arg-type]
