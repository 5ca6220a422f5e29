"""The memory vault over HTTP: ``/api/memory/*`` (init, status, list, search, article, links,
history, diff) and ``GET /v1/memory/synthesize`` (SSE).

Thin wrappers over :mod:`mlxbun_core.memory`. Every route touches the filesystem, so all are
admin routes (loopback only unless an API key is configured; ``/api/`` already is one,
``/v1/memory`` is marked here). Answers are ``{"ok": true, ...}`` or ``{"ok": false,
"error": ...}`` with a 4xx for a client mistake. With no vault yet, the routes that read the
whole vault (status, list, search) answer 200 ``{"ok": true, "enabled": false, "root": ...,
"message": "no memory vault yet"}`` with empty results: a state the page shows, not an error;
those about one article, and synthesis, answer 404 ``{"ok": false, "enabled": false, ...}``.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..errors import APIError, BadRequest
from ..memory.synthesis import Synthesis
from ..memory.vault import NO_VAULT, NoVault, Vault, default_root
from ..server.body import read_body
from ..server.common import json_response, sse_data, sse_response
from ..webchat.memory import saved_conversations
from . import state as webapp_state

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App

MAX_LIMIT = 200
MAX_QUERY_CHARS = 500
REV_RE = re.compile(r"^[0-9a-f]{4,40}$")
SCOPES = ("all", "articles", "reference")
Json = dict[str, Any]
FLAGS = {"1": True, "true": True, "0": False, "false": False, "": False}


def _param(request: Request, name: str, required: bool = False) -> str | None:
    values = request.query.get(name)
    value = values[0] if values else None
    if required and not (value and value.strip()):
        raise BadRequest(f"{name} is required")
    if value is not None and len(value) > MAX_QUERY_CHARS:
        raise BadRequest(f"{name} is longer than {MAX_QUERY_CHARS} characters")
    return value


def _limit(request: Request, default: int = 50) -> int:
    raw = _param(request, "limit")
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise BadRequest("limit must be a positive integer")
    return min(int(raw), MAX_LIMIT)


def _flag(request: Request, name: str) -> bool:
    raw = (_param(request, name) or "").lower()
    if raw not in FLAGS:
        raise BadRequest(f"{name} must be 1 or 0")
    return FLAGS[raw]


def _failure(exc: APIError, root: Path) -> Response:
    if isinstance(exc, NoVault):
        return json_response({"ok": False, "enabled": False, "error": exc.message,
                              "root": str(root)}, exc.status)
    return json_response({"ok": False, "error": exc.message}, exc.status)


async def _optional_body(request: Request) -> Json:
    """A POST's JSON object, or ``{}`` when it sent no body at all."""
    length = request.get_first_header(b"content-length")
    if length in (None, b"0") and request.get_first_header(b"transfer-encoding") is None:
        return {}
    return await read_body(request)


def init_path(raw: Any, default: Path) -> Path:
    """Where ``POST /api/memory/init`` may set up a vault: the default root, or a folder
    under it or under the OS temp directory; anything else is a 400."""
    if raw is None:
        return default
    if not isinstance(raw, str) or not raw or "\0" in raw:
        raise BadRequest("path must be a non-empty string")
    target = Path(raw).expanduser().resolve()
    allowed = (default.resolve(), Path(tempfile.gettempdir()).resolve())
    if not any(target == a or a in target.parents for a in allowed):
        raise BadRequest("path must be inside the default vault root or the temp directory")
    return target


class MemoryRoutes:
    """The JSON routes' work, one method per route: ``(request, body) -> answer``, run in a
    thread; an APIError is the client's 4xx."""

    def __init__(self, vault: Vault):
        self.vault = vault

    def no_vault(self, **empty: Any) -> Json | None:
        """The 200 answer of a route that reads the whole vault when there is none yet
        (a state the Memory page shows, not an error), else None."""
        if self.vault.exists:
            return None
        return {"enabled": False, "root": str(self.vault.root), "message": NO_VAULT, **empty}

    def status(self, request: Request, body: Json) -> Json:
        absent = self.no_vault(status=None)
        return absent or {"enabled": True, "status": self.vault.status()}

    def listing(self, request: Request, body: Json) -> Json:
        absent = self.no_vault(articles=[], reference=[])
        return absent or {"articles": self.vault.article_names(),
                          "reference": self.vault.reference_ids()}

    def search(self, request: Request, body: Json) -> Json:
        query = _param(request, "q", required=True) or ""
        scope = _param(request, "scope") or "all"
        if scope not in SCOPES:
            raise BadRequest(f"scope must be one of {', '.join(SCOPES)}")
        limit = _limit(request)
        return self.no_vault(summaries=[], hits=[]) or self.vault.search(query, scope, limit)

    def article(self, request: Request, body: Json) -> Json:
        name = _param(request, "name", required=True) or ""
        self.vault.require()
        return self.vault.article(name)

    def links(self, request: Request, body: Json) -> Json:
        name = _param(request, "name", required=True) or ""
        self.vault.require()
        return self.vault.links(name)

    def history(self, request: Request, body: Json) -> Json:
        name = _param(request, "name", required=True) or ""
        limit = _limit(request)
        self.vault.require()
        return {"name": name, "isGitRepo": False, "entries": self.vault.log(name, limit)}

    def diff(self, request: Request, body: Json) -> Json:
        name = _param(request, "name", required=True) or ""
        rev = _param(request, "rev", required=True) or ""
        if not REV_RE.match(rev):
            raise BadRequest("rev must be a revision id: 4 to 40 lower-case hex digits")
        self.vault.require()
        return {"name": name, "rev": rev, "diff": self.vault.diff(name, rev)}

    def init(self, request: Request, body: Json) -> Json:
        """Set up the served vault, or (``path``) another one under an allowed folder."""
        target = init_path(body.get("path"), self.vault.root)
        chosen = self.vault if "path" not in body or target == self.vault.root.resolve() \
            else Vault(target)
        result = chosen.setup()
        return {"result": vars(result), "status": chosen.status()}


GETS = {"status": "status", "list": "listing", "search": "search", "article": "article",
        "links": "links", "history": "history", "diff": "diff"}  # path -> MemoryRoutes method


def register(app: App, engine: Engine) -> None:
    vault = Vault(default_root())
    routes = MemoryRoutes(vault)  # /api/memory and /v1/memory: admin routes (guard.py)

    def handler(work: Callable[[Request, Json], Json], post: bool = False
                ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            try:
                body = await _optional_body(request) if post else {}
                return json_response({"ok": True, **await asyncio.to_thread(work, request, body)})
            except APIError as exc:
                return _failure(exc, vault.root)

        return handle

    for path, method in GETS.items():
        app.router.add_get(f"/api/memory/{path}", handler(getattr(routes, method)))
    app.router.add_post("/api/memory/init", handler(routes.init, post=True))
    running: list[Synthesis] = []  # the latest synthesis: one may be active at a time
    app.router.add_get("/v1/memory/synthesize", _synthesize_handler(app, engine, vault, running))


def _synthesize_handler(app: App, engine: Engine, vault: Vault,
                        running: list[Synthesis]) -> Callable[[Request], Awaitable[Response]]:
    async def synthesize(request: Request) -> Response:
        try:
            dry, force = _flag(request, "dry"), _flag(request, "force")
            vault.require()
        except APIError as exc:
            return _failure(exc, vault.root)
        if any(j.active for j in running):
            return json_response({"ok": False, "error": "a synthesis is running"}, 409)
        job = Synthesis(vault, engine, [], dry=dry, force=force)
        running[:] = [job]
        sessions = webapp_state.of(app).sessions
        job.conversations = await asyncio.to_thread(saved_conversations, sessions)

        async def frames() -> AsyncIterator[bytes]:
            try:
                async for event in job.run():
                    yield sse_data(event)
                if not job.cancelled:
                    yield b"data: [DONE]\n\n"
            except Exception as exc:  # reported on the stream, as the spec says
                yield sse_data({"type": "error", "message": str(exc) or type(exc).__name__})
            finally:
                job.finished = True

        return sse_response(request, job, frames())

    return synthesize
