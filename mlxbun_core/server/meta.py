"""Discovery and health: GET /v1, /v1/models, /v1/models/<id>, /health, /stats.

``/v1/models`` lists the served model first (with its capability fields), then every
other supported model of the local library (see :mod:`.library_routes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blacksheep import Request

from .. import __version__, plugins
from ..grammar_registry import registry as grammars
from ..toolcalls.history import supports_tools
from .common import json_response
from .library_routes import model_rows

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App

ENDPOINTS = ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
             "POST /v1/messages/count_tokens", "POST /v1/responses",
             "GET/DELETE /v1/responses/<id>", "POST /v1/embeddings", "GET /v1/models",
             "GET /health", "GET /stats", "GET /metrics", "GET /fit", "GET /library",
             "GET/POST /v1/adapters", "GET /v1/adapters/available", "DELETE /v1/adapters/<id>",
             "GET /api/jobs", "POST /api/finetune/*", "POST /api/quantize/*"]


def media_kinds(engine: Engine) -> set:
    """The media kinds a plugin accepts for the served model (asked through the hook)."""
    m = engine.model
    if m.kind != "generate":
        return set()
    hook = engine.hooks
    return {k for k in ("image", "audio", "video")
            if hook.media_pipeline(model=m, kind=k) is not None}


def template_renders_tools(model) -> bool:
    """Whether the model's own chat template shows tool definitions to the model.

    (Tools still work with a template that ignores them: the request path then writes
    them into the system turn. This field says which models were made for tools.)
    """
    if model.kind != "generate":
        return False
    template = getattr(model.tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates ("default", "tool_use", ...)
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    return isinstance(template, str) and supports_tools(template)[0]


def model_row(engine: Engine) -> dict:
    m = engine.model
    generate = m.kind == "generate"
    media = media_kinds(engine)
    tools = template_renders_tools(m)
    caps = {"chat_completions": generate, "text_completions": generate,
            "anthropic_messages": generate, "responses": generate, "streaming": generate,
            "tools": tools, "structured_output": generate, "logprobs": generate,
            "embeddings": m.kind == "embedding", "vision": "image" in media,
            "audio": "audio" in media, "video": "video" in media,
            "adapters": generate, "training": generate}
    d = engine.defaults
    return {"id": m.id, "object": "model", "created": engine.started_at, "owned_by": "mlxbun",
            "family": m.family, "plugin": m.plugin, "context_window": m.context_window,
            "reasoning": m.reasoning, "vision": caps["vision"], "audio": caps["audio"],
            "video": caps["video"], "batch_mode": "batched" if engine.batch > 1 else "serial",
            "tools": tools, "structured_output": generate, "embeddings": caps["embeddings"],
            "adapters": generate, "training": generate, "capabilities": caps,
            "gen_defaults": {k: d.get(k) for k in ("temperature", "top_p", "top_k")}}


def register(app: App, engine: Engine) -> None:
    async def index(request: Request):
        from .ws_chat import availability  # (ws_chat imports this module)

        return json_response({"name": "mlxbun", "version": __version__, "model": engine.model.id,
                              "endpoints": ENDPOINTS, "web_chat": availability(app, request)})

    async def all_rows() -> list:
        return [model_row(engine)] + await model_rows(app, engine.model.id, engine.started_at)

    async def models(request: Request):
        return json_response({"object": "list", "data": await all_rows()})

    async def model_by_id(request: Request):
        """OpenAI's retrieve: the model object itself (every field of its list row)."""
        wanted = request.route_values.get("tail", "")
        row = next((r for r in await all_rows() if r["id"] == wanted), None)
        if row is None:
            return json_response({"error": {
                "message": f"The model {wanted!r} does not exist (GET /v1/models lists them)",
                "type": "invalid_request_error", "param": "model",
                "code": "model_not_found"}}, 404)
        return json_response(row)

    async def health(request: Request):
        if engine.draining:  # load balancers stop sending; in-flight requests finish
            return json_response({"status": "draining"}, 503)
        return json_response({"status": "ok"})

    async def stats(request: Request):
        extra = {}
        for name, provider in app.state.stats_providers.items():
            extra[name] = provider()
        return json_response({
            "server": {"owner": "serve", "model": engine.model.id, "family": engine.model.family,
                       "plugin": engine.model.plugin, "started_at": engine.started_at},
            "requests": engine.stats(),
            "batch": engine.batch_stats(),
            "prompt_cache": engine.prefix.stats(),
            "kv_quant": engine.kv_quant_stats(),
            "admission": {**engine.admission.stats(), "max_waiting": engine.worker.max_waiting},
            "grammar": grammars.stats(),
            "speculation": ({"draft": engine.draft.name,
                             "num_draft_tokens": engine.draft.num_draft_tokens}
                            if engine.draft else None),
            "plugins": [r["name"] for r in plugins.describe() if not r["error"]],
            **extra})

    app.router.add_get("/v1", index)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/*", model_by_id)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
