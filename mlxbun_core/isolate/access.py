"""Who may use the ``--isolate`` parent: the serve guard's rules on the parent's TCP side
(the engines behind the socket see only the parent)."""

from __future__ import annotations

import hmac

from ..server import guard
from ..server.web import open_paths

OPEN_PATHS = guard.OPEN_PATHS + open_paths()  # answer without the API key


def check(scope, api_key: str | None) -> tuple | None:
    """``(status, body)`` to refuse the request with, or None: the API key on every route
    but /health and the web page's static shell; admin routes for loopback clients only
    when there is no key. Errors take the Anthropic shape on /v1/messages."""
    path = scope["path"]
    anthropic = path.startswith("/v1/messages")
    if api_key is not None and not guard.is_open(path, OPEN_PATHS):
        got = presented_key(scope)
        if got is None or not hmac.compare_digest(got.encode(), api_key.encode()):
            return 401, _error("authentication_error", "invalid or missing API key "
                               "(send Authorization: Bearer <key>)", anthropic)
    elif path.startswith(guard.ADMIN_PREFIXES) and not guard.is_loopback_client(
            scope.get("client")):
        return 403, _error("permission_error", "this route answers loopback clients only; "
                           "start the server with --api-key to allow remote clients", anthropic)
    return None


def presented_key(scope) -> str | None:
    """The key a request sent: ``Authorization: Bearer`` or ``x-api-key``."""
    headers = dict(scope["headers"])
    auth = headers.get(b"authorization")
    if auth and auth[:7].lower() == b"bearer ":
        return auth[7:].decode("latin-1").strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key else None


def _error(kind: str, message: str, anthropic: bool) -> dict:
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind}}
