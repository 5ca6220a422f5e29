"""What the routes share, as one typed record on the application: ``app.state``.

Every surface module exposes ``register(app: App, engine: Engine)``. What more than one
module needs (the response store, the web chat's sessions, the library scan, the job
manager, the guard's rules, extra ``/stats`` sections, a few switches) lives in
:class:`AppState`, typed, never as loose attributes on the BlackSheep application.

Adding something: give :class:`AppState` a field (with a default, or a value that
:func:`~mlxbun_core.server.app.build_app` passes in), then read or fill it as
``app.state.<field>`` in your module's ``register``. A ``/stats`` section is an entry
in ``stats_providers``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from blacksheep import Application
from blacksheep.server.routing import Router
from prometheus_client import CollectorRegistry

from ..hub.jobs import HubJobs
from ..jobs.runner import Jobs
from ..library.cache import LibraryCache
from ..models.paths import mlxbun_home
from ..webchat.store import SessionStore, sessions_dir
from . import head
from .guard import GuardRules
from .openai.response_store import ResponseStore

if TYPE_CHECKING:
    from ..engine.core import Engine


@dataclass
class AppState:
    """The served engine and everything the routes share."""

    engine: Engine
    guard: GuardRules = field(default_factory=GuardRules)
    """Who may call what: the API key, admin prefixes and open paths (:mod:`.guard`)."""
    sessions: SessionStore = field(default_factory=lambda: SessionStore(sessions_dir()))
    """The web chat's sessions (the ``/ws/chat`` agent and ``/api/sessions/*``)."""
    responses: ResponseStore = field(default_factory=ResponseStore)
    """Stored Responses, for ``previous_response_id`` and ``GET /v1/responses/<id>``."""
    library: LibraryCache = field(default_factory=LibraryCache)
    """The local model scan (``/library``, the rows of ``/v1/models``)."""
    jobs: Jobs = field(default_factory=lambda: Jobs(mlxbun_home()))
    """Fine-tune and quantize jobs (``/api/jobs``, ``/api/finetune/*``, ``/api/quantize/*``)."""
    hub_jobs: HubJobs = field(default_factory=lambda: HubJobs(mlxbun_home()))
    """Downloads, pushes and dataset builds: their own queue (``/api/hub/*``, ``/downloads``)."""
    stats_providers: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    """Extra ``/stats`` sections: name -> a callable returning a JSON-able dict."""
    health_providers: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    """Extra ``/health`` fields (cheap to compute): name -> a callable returning a dict."""
    trusts_injected_history: bool = False
    """An ``--isolate`` engine child: the parent sends Responses history in the body."""
    web_chat_unavailable: str | None = None
    """A reason ``/ws/chat`` answers 501 with (the ``--isolate`` parent proxy sets one)."""
    metrics: CollectorRegistry | None = None
    """This app's Prometheus registry (``GET /metrics``; :mod:`mlxbun_core.metrics`)."""
    model_aliases: dict[str, str] = field(default_factory=dict)
    """``mlxbun.yaml``'s aliases: listed by ``/v1/models`` (alias -> model id)."""
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    """``mlxbun.yaml``'s ``mcp_servers:`` (name -> McpServerSpec): the web chat's MCP tools,
    started on first use (:mod:`mlxbun_core.webchat.mcp`)."""


class App(Application):
    """The BlackSheep application of one served engine, with its :class:`AppState`."""

    def __init__(self, state: AppState):
        super().__init__(router=Router())  # not BlackSheep's process-wide default router
        self.state = state

    async def __call__(self, scope: head.Message, receive: head.Receive,
                       send: head.Send) -> None:
        """The ASGI entry: a HEAD runs as its GET, without the body (:mod:`.head`)."""
        base = cast("head.ASGIApp", super().__call__)  # BlackSheep's own is unannotated
        if head.is_head(scope):
            return await head.as_get(base, scope, receive, send)
        await base(scope, receive, send)
