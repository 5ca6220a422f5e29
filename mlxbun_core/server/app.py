"""Builds the BlackSheep application: every surface registers its routes here."""

from __future__ import annotations

import importlib
import logging

from blacksheep import Application, Request
from blacksheep.server.routing import Router

from . import guard
from .common import json_response

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


def build_app(engine, *, api_key: str | None = None, sessions_dir=None) -> Application:
    """``sessions_dir``: where the web chat keeps sessions (default: under our home)."""
    app = Application(router=Router())  # not BlackSheep's process-wide default router
    app.sessions_dir = sessions_dir
    guard.install(app, api_key)
    app.stats_providers = {}  # name -> callable returning a JSON-able dict for /stats
    for modname in SURFACES:
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name == modname:
                continue  # surface not present in this build
            raise
        module.register(app, engine)

    async def not_found(request: Request):
        return json_response({"error": {"message": "not found", "type": "not_found_error"}}, 404)

    app.router.fallback = not_found

    async def on_stop(application):
        engine.worker.close()

    app.on_stop += on_stop
    return app
