"""What the routes share, as one typed record on the application: ``app.state``.

Every surface module exposes ``register(app: App, engine: Engine)``. What more than one
module needs (the response store, the library scan, the guard's rules, extra ``/stats``
sections, a few switches) lives in
:class:`AppState`, typed, never as loose attributes on the BlackSheep application.

Adding something: give :class:`AppState` a field (with a default, or a value that
:func:`~mlxbun_core.server.app.build_app` passes in), then read or fill it as
``app.state.<field>`` in your module's ``register``. A ``/stats`` section is an entry
in ``stats_providers``. A plugin's own services (the web app's sessions and job queues)
live in ``plugins`` under its name, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from blacksheep import Application, Request
from blacksheep.server.routing import Router
from prometheus_client import CollectorRegistry

from ..library.cache import LibraryCache
from . import handshake, head
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
    responses: ResponseStore = field(default_factory=ResponseStore)
    """Stored Responses, for ``previous_response_id`` and ``GET /v1/responses/<id>``."""
    library: LibraryCache = field(default_factory=LibraryCache)
    """The local model scan (``/library``, the rows of ``/v1/models``)."""
    stats_providers: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    """Extra ``/stats`` sections: name -> a callable returning a JSON-able dict."""
    health_providers: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    """Extra ``/health`` fields (cheap to compute): name -> a callable returning a dict."""
    trusts_injected_history: bool = False
    """An ``--isolate`` engine child: the parent sends Responses history in the body."""
    metrics: CollectorRegistry | None = None
    """This app's Prometheus registry (``GET /metrics``; :mod:`mlxbun_core.metrics`)."""
    model_aliases: dict[str, str] = field(default_factory=dict)
    """``mlxbun.yaml``'s aliases: listed by ``/v1/models`` (alias -> model id)."""
    index_providers: dict[str, Callable[[Request], Any]] = field(default_factory=dict)
    """Fields of ``GET /v1`` a plugin answers: name -> a callable of the request (the web
    app's ``web_chat``)."""
    plugins: dict[str, object] = field(default_factory=dict)
    """Each plugin's own shared state on this app, under its name (the web app's:
    :mod:`mlxbun_core.webapp.state`); the core reads none of it."""


class App(Application):
    """The BlackSheep application of one served engine, with its :class:`AppState`."""

    def __init__(self, state: AppState):
        super().__init__(router=Router())  # not BlackSheep's process-wide default router
        self.state = state

    async def __call__(self, scope: head.Message, receive: head.Receive,
                       send: head.Send) -> None:
        """The ASGI entry: a HEAD runs as its GET, without the body (:mod:`.head`); a
        WebSocket's ``send`` is its :class:`~.handshake.Handshake` (a refusal answers
        through it)."""
        base = cast("head.ASGIApp", super().__call__)  # BlackSheep's own is unannotated
        if head.is_head(scope):
            return await head.as_get(base, scope, receive, send)
        await base(scope, receive, handshake.wrap(scope, send))
