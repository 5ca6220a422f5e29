"""The web app as the built-in plugin ``webapp``: its pages, the ``/ws/chat`` socket, the
``/api/*`` routes (hub, jobs, lab, memory vault, sessions, settings), the Curve Designer,
and the ``train``, ``quantize`` and ``memory`` verbs, all through the same hooks an
installed plugin uses. ``MLXBUN_DISABLE_PLUGINS=webapp`` leaves a server of the inference
APIs alone (docs/plugins.md).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App

NAME = "webapp"
"""This plugin's name (``mlxbun plugins``, ``MLXBUN_DISABLE_PLUGINS``)."""

ROUTES = (
    "mlxbun_core.webapp.jobs",
    "mlxbun_core.webapp.hub",
    "mlxbun_core.webapp.admin",
    "mlxbun_core.webapp.lab",
    "mlxbun_core.webapp.sessions",
    "mlxbun_core.webapp.memory",
    "mlxbun_core.webapp.chat_socket",
    "mlxbun_core.webapp.curves",
    "mlxbun_core.webapp.pages",
)


@hookimpl(trylast=True)
def register_routes(app: App, engine: Engine) -> None:
    """The app's routes, after the APIs and every installed plugin's."""
    from ..server.api import register_surfaces

    register_surfaces(app, engine, ROUTES)


@hookimpl
def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``train`` and ``quantize`` (the app's job runners in the foreground), ``train-watch``,
    ``fuse``, ``memory``."""
    from ..jobs import cli as jobs_cli
    from ..jobs import fuse as jobs_fuse
    from ..jobs import watch as jobs_watch
    from ..memory import cli as memory_cli

    jobs_cli.add_parsers(subparsers)
    memory_cli.add_parsers(subparsers)
    subparsers.choices["train"].set_defaults(handler=jobs_cli.cmd_train)
    subparsers.choices["quantize"].set_defaults(handler=jobs_cli.cmd_quantize)
    subparsers.choices["train-watch"].set_defaults(handler=jobs_watch.cmd_train_watch)
    subparsers.choices["fuse"].set_defaults(handler=jobs_fuse.cmd_fuse)
    subparsers.choices["memory"].set_defaults(handler=_memory)


def _memory(args: argparse.Namespace) -> int:
    """``mlxbun memory``: the vault's verbs, synthesis over the web chat's saved sessions."""
    from ..memory.cli import cmd_memory
    from ..webchat.memory import saved_conversations
    from ..webchat.store import SessionStore, sessions_dir

    return cmd_memory(args, lambda d: saved_conversations(SessionStore(sessions_dir(d))))
