"""GET /api/sessions/search and /api/sessions/export: the web chat's sessions over HTTP.

Both read the sessions directory the web chat writes (admin routes: loopback-only
unless an API key is configured, enforced by the guard) and need no model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blacksheep import Request, Response

from ..errors import APIError
from ..server.common import json_response
from ..webchat.search import search
from ..webchat.store import compacted, read_entries
from . import state as webapp_state

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App

MAX_QUERY_CHARS = 500


def _error(message: str, status: int) -> Response:
    return json_response({"ok": False, "error": message}, status)


def register(app: App, engine: Engine) -> None:
    store = webapp_state.of(app).sessions

    async def search_sessions(request: Request) -> Response:
        query = (request.query.get("q") or [""])[0]
        if not query.strip():
            return _error("q is required", 400)
        if len(query) > MAX_QUERY_CHARS:
            return _error(f"q is longer than {MAX_QUERY_CHARS} characters", 400)
        return json_response({"ok": True, "results": search(store, query)})

    async def export_session(request: Request) -> Response:
        path = (request.query.get("path") or [""])[0]
        try:
            target = store.resolve(path)
        except APIError as exc:
            return _error(exc.message, exc.status)
        return json_response({"ok": True, "path": str(target),
                              "entries": compacted(read_entries(target))})

    app.router.add_get("/api/sessions/search", search_sessions)
    app.router.add_get("/api/sessions/export", export_session)
