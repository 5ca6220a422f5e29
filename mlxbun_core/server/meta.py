"""Discovery and health: GET /v1, /v1/models, /v1/models/<id>, /health, /stats.

``/v1/models`` lists the served model first (its row and capability fields come from
:mod:`.served_model`), then every other supported model of the local library (see
:mod:`.library_routes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from .. import __version__, plugins
from ..engine.cache_explain import without_text
from ..grammar_registry import registry as grammars
from ..library.listing import with_states
from .common import json_response
from .guard import is_loopback
from .library_routes import model_rows
from .model_report import with_family_blocks
from .served_model import model_row

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App

ENDPOINTS = ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
             "POST /v1/messages/count_tokens", "POST /v1/responses",
             "GET/DELETE /v1/responses/<id>", "POST /v1/embeddings", "POST /v1/rerank",
             "GET /v1/models", "GET /health", "GET /stats", "GET /metrics", "GET /fit",
             "GET /library", "GET/POST /v1/adapters", "GET /v1/adapters/available",
             "DELETE /v1/adapters/<id>"]
JOB_ENDPOINTS = ["GET /api/jobs", "POST /api/finetune/*", "POST /api/quantize/*"]
"""The web app's job routes, listed when the app is served."""
NO_WEB_APP = "this server has no web app (the webapp plugin is not loaded)"
"""``GET /v1``'s ``web_chat`` reason unless a plugin answers that field (the web app does)."""


def has_route(app: App, method: str, path: str) -> bool:
    """Whether a plugin registered ``method path`` (``GET_WS`` for a WebSocket)."""
    match = app.router.get_match_by_method_and_path(method, path)
    return match is not None and match.pattern != b"*"


def prompt_cache_stats(request: Request, app: App, engine: Engine) -> dict[str, Any]:
    """``/stats.prompt_cache``; its recent log's decoded prompt text only for a client
    the admin routes would answer (loopback, or any client once an API key is set)."""
    out = engine.prefix.stats()
    if app.state.guard.api_key is None and not is_loopback(request):
        out["recent"] = without_text(out["recent"])
    return out


def register(app: App, engine: Engine) -> None:
    no_web_chat = {"available": False, "reason": NO_WEB_APP}

    async def index(request: Request) -> Response:
        return json_response({"name": "mlxbun", "version": __version__, "model": engine.model.id,
                              "endpoints": endpoints(), "web_chat": no_web_chat,
                              **{name: provide(request)
                                 for name, provide in app.state.index_providers.items()}})

    def endpoints() -> list[str]:
        return ENDPOINTS + (JOB_ENDPOINTS if has_route(app, "GET", "/api/jobs") else [])

    async def all_rows() -> list[dict[str, Any]]:
        rows = [model_row(engine)] + await model_rows(app, engine.model.id, engine.started_at)
        return with_states(rows, app.state.model_aliases, engine.started_at)

    async def models(request: Request) -> Response:
        return json_response({"object": "list", "data": await all_rows()})

    async def model_by_id(request: Request) -> Response:
        """OpenAI's retrieve: the model object itself (every field of its list row)."""
        wanted = request.route_values.get("tail", "")
        row = next((r for r in await all_rows() if r["id"] == wanted), None)
        if row is None:
            return json_response({"error": {
                "message": f"The model {wanted!r} does not exist (GET /v1/models lists them)",
                "type": "invalid_request_error", "param": "model",
                "code": "model_not_found"}}, 404)
        return json_response(row)

    async def health(request: Request) -> Response:
        extra = {name: provider() for name, provider in app.state.health_providers.items()}
        if engine.unavailable is not None:  # e.g. a rank of a --distributed group was lost
            return json_response({"status": "unavailable", "reason": engine.unavailable,
                                  **extra}, 503)
        if engine.draining:  # load balancers stop sending; in-flight requests finish
            return json_response({"status": "draining", **extra}, 503)
        return json_response({"status": "ok", **extra})

    async def stats(request: Request) -> Response:
        extra: dict[str, dict[str, Any]] = {}
        for name, provider in app.state.stats_providers.items():
            extra[name] = provider()
        body = {
            "server": {"owner": "serve", "model": engine.model.id, "family": engine.model.family,
                       "plugin": engine.model.plugin, "started_at": engine.started_at},
            "requests": engine.stats(),
            "batch": engine.batch_stats(),
            "prompt_cache": prompt_cache_stats(request, app, engine),
            "kv_quant": engine.kv_quant_stats(),
            "admission": {**engine.admission.stats(), "max_waiting": engine.worker.max_waiting},
            "memory": engine.memory_stats(),
            "grammar": grammars.stats(),
            "fill": engine.fill.stats(),
            "speculation": ({"draft": engine.draft.name,
                             "num_draft_tokens": engine.draft.num_draft_tokens}
                            if engine.draft else engine.lookup_stats()),
            "plugins": [r["name"] for r in plugins.describe() if not r["error"]],
            **extra}
        return json_response(with_family_blocks(body, engine.model, "stats"))

    app.router.add_get("/v1", index)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/*", model_by_id)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
