"""What the web app's routes share on one served app: the chat's sessions, the job
queues, MCP servers and whether the chat socket may open. The core app holds none of
it; it lives in ``app.state.plugins`` under the plugin's name, made on first use (a test
may put one there first, through ``build_app(plugin_state=...)``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..hub.jobs import HubJobs
from ..jobs.runner import Jobs
from ..models.paths import mlxbun_home
from ..webchat.store import SessionStore, sessions_dir

if TYPE_CHECKING:
    from ..server.state import App

KEY = "webapp"
"""Where the record lives in ``app.state.plugins`` (the plugin's name)."""


@dataclass
class WebAppState:
    """The web app's shared services on one app."""

    sessions: SessionStore = field(default_factory=lambda: SessionStore(sessions_dir()))
    """The web chat's sessions (the ``/ws/chat`` agent and ``/api/sessions/*``)."""
    jobs: Jobs = field(default_factory=lambda: Jobs(mlxbun_home()))
    """Fine-tune and quantize jobs (``/api/jobs``, ``/api/finetune/*``, ``/api/quantize/*``)."""
    hub_jobs: HubJobs = field(default_factory=lambda: HubJobs(mlxbun_home()))
    """Downloads, pushes and dataset builds: their own queue (``/api/hub/*``, ``/downloads``)."""
    chat_unavailable: str | None = None
    """A reason ``/ws/chat`` answers 501 with (a server that cannot host the chat)."""
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    """``mlxbun.yaml``'s ``mcp_servers:`` (name -> McpServerSpec): the web chat's MCP tools,
    started on first use (:mod:`mlxbun_core.webchat.mcp`)."""


def of(app: App) -> WebAppState:
    """``app``'s web app record, made (with the defaults) the first time it is asked."""
    state = app.state.plugins.get(KEY)
    if not isinstance(state, WebAppState):
        state = app.state.plugins[KEY] = WebAppState()
    return state


def web_app_state(sessions: Path | None) -> dict[str, object]:
    """``build_app``'s ``plugin_state`` for a web app keeping its sessions in ``sessions``
    (None: the default folder under our home)."""
    return {KEY: WebAppState(sessions=SessionStore(sessions_dir(sessions)))}
