"""The core's inference APIs as the built-in plugin ``api``: every surface module here
registers its routes through the ``register_routes`` hook, as an installed plugin's do.

Each module in :data:`SURFACES` exposes ``register(app: App, engine: Engine)`` and keeps
what other modules read in ``app.state`` (see :mod:`.state`). The web app's routes are a
plugin of their own (:mod:`mlxbun_core.webapp`), so the APIs stand without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App

SURFACES = (
    "mlxbun_core.server.openai.chat",
    "mlxbun_core.server.openai.completions",
    "mlxbun_core.server.tokenizer_routes",
    "mlxbun_core.server.anthropic.messages",
    "mlxbun_core.server.openai.responses",
    "mlxbun_core.server.openai.embeddings",
    "mlxbun_core.server.rerank",
    "mlxbun_core.server.transcriptions",
    "mlxbun_core.server.meta",
    "mlxbun_core.server.cache_admin",
    "mlxbun_core.server.library_routes",
    "mlxbun_core.server.adapters",
)


def register_surfaces(app: App, engine: Engine, modules: Iterable[str]) -> None:
    """Call each module's ``register``, in order; a module absent from this build is
    left out (its package trimmed), any other import error is a bug and raises."""
    for modname in modules:
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name == modname:
                continue
            raise
        module.register(app, engine)


@hookimpl(tryfirst=True)
def register_routes(app: App, engine: Engine) -> None:
    """The inference APIs, before any other plugin's routes."""
    register_surfaces(app, engine, SURFACES)
