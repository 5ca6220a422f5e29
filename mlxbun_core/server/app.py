"""Builds the BlackSheep application: every surface registers its routes here."""

from __future__ import annotations

import importlib
import logging

from blacksheep import Application, Request
from blacksheep.server.routing import Router

from .. import blas
from .. import metrics
from . import guard
from .common import allowed_methods, json_response, method_not_allowed, openai_error

log = logging.getLogger("mlxbun.server")

# One module per protocol surface; each exposes ``register(app, engine)``.
SURFACES = (
    "mlxbun_core.server.openai_chat",
    "mlxbun_core.server.openai_completions",
    "mlxbun_core.server.anthropic_messages",
    "mlxbun_core.server.openai_responses",
    "mlxbun_core.server.embeddings",
    "mlxbun_core.server.meta",
    "mlxbun_core.server.cache_admin",
    "mlxbun_core.server.library_routes",
    "mlxbun_core.server.adapters",
    "mlxbun_core.server.jobs",
    "mlxbun_core.server.sessions",
    "mlxbun_core.server.ws_chat",
    "mlxbun_core.server.web",
)


def error_shape(path: str):
    """How the surface at ``path`` renders an error (Anthropic's routes their own shape)."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        from .anthropic_messages import anthropic_error

        return anthropic_error
    return openai_error


def build_app(engine, *, api_key: str | None = None, sessions_dir=None) -> Application:
    """``sessions_dir``: where the web chat keeps sessions (default: under our home)."""
    app = Application(router=Router())  # not BlackSheep's process-wide default router
    app.sessions_dir = sessions_dir
    guard.install(app, api_key)
    metrics.install(app, engine)  # GET /metrics; counts every route's answers
    app.stats_providers = {}  # name -> callable returning a JSON-able dict for /stats
    app.stats_providers["blas"] = lambda: blas.state().describe()
    for modname in SURFACES:
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name == modname:
                continue  # surface not present in this build
            raise
        module.register(app, engine)

    async def not_found(request: Request):
        allowed = allowed_methods(app.router, request.url.path)
        if allowed:  # the path exists for other methods: 405 in that surface's error shape
            path = request.url.path.decode("utf-8", "replace")
            return method_not_allowed(request.method, path, allowed, error_shape(path))
        return json_response({"error": {"message": "not found", "type": "not_found_error"}}, 404)

    app.router.fallback = not_found

    async def on_stop(application):
        engine.worker.close()

    app.on_stop += on_stop
    return app
