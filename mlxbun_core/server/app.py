"""Builds the BlackSheep application: the guard, then every plugin's ``register_routes``
(the core's inference APIs, :mod:`.api`, first; the web app, :mod:`mlxbun_core.webapp`, last)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from blacksheep import Application, Request, Response

from .. import blas, metrics, plugins
from ..errors import APIError
from . import access_log, guard
from .common import allowed_methods, json_response, method_not_allowed, openai_error
from .guard import GuardRules
from .origin import CorsRules
from .state import App, AppState

if TYPE_CHECKING:
    from ..engine.core import Engine

log = logging.getLogger("mlxbun.server")

def error_shape(path: str) -> Callable[[APIError], Response]:
    """How the surface at ``path`` renders an error (Anthropic's routes their own shape)."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        from .anthropic.messages import anthropic_error

        return anthropic_error
    return openai_error


def build_app(engine: Engine, *, api_key: str | None = None,
              cors: CorsRules | None = None,
              plugin_state: dict[str, object] | None = None) -> App:
    """The application serving ``engine``. ``cors``: the sites ``--cors`` trusts;
    ``plugin_state``: plugins' own records, there before their routes register (a
    test's web app with its own sessions folder)."""
    rules = GuardRules(api_key=api_key, cors=cors or CorsRules())
    state = AppState(engine=engine, guard=rules, plugins=dict(plugin_state or {}))
    app = App(state)
    guard.install(app, state.guard)
    access_log.install(app)  # after every middleware: the outermost, so it sees refusals
    metrics.install(app, engine)  # GET /metrics; counts every route's answers
    state.stats_providers["blas"] = lambda: blas.state().describe()
    plugins.hook().register_routes(app=app, engine=engine)  # the APIs, plugins', the web app

    async def not_found(request: Request) -> Response:
        allowed = allowed_methods(app.router, request.url.path)
        if allowed:  # the path exists for other methods: 405 in that surface's error shape
            path = request.url.path.decode("utf-8", "replace")
            return method_not_allowed(request.method, path, allowed, error_shape(path))
        return json_response({"error": {"message": "not found", "type": "not_found_error"}}, 404)

    app.router.fallback = not_found

    async def on_stop(application: Application) -> None:
        engine.close()

    app.on_stop += on_stop
    return app
