"""GET /metrics and the per-route request counter of one BlackSheep app.

Each app has its own :class:`~prometheus_client.CollectorRegistry` (tests build many apps
in one process; the process-wide default registry would mix them). The request counter
is labelled by the route's *template* (``/v1/models/*``, never the raw path, so a
scanner cannot grow the series without bound): once BlackSheep has chained the
middlewares into each route, :func:`install` wraps every route's chain in a counter
that already knows its template, so counting costs no route lookup. Wrapping outside
the chain means the guard's refusals (401, 403) are counted too.

``/metrics`` follows the guard like every other route: with an API key it needs the
key (Prometheus sends it with ``authorization: {credentials: KEY}`` or
``bearer_token_file``); without one it answers any client, as generation routes do.
"""

from __future__ import annotations

import functools

from blacksheep import Request, Response
from blacksheep.contents import Content
from blacksheep.exceptions import HTTPException
from prometheus_client import CollectorRegistry, Counter, exposition, generate_latest

from .engine import for_engine

PATH = "/metrics"
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
OTHER_ROUTE = "other"  # what matched no route (the 404 fallback)


def request_counter(registry: CollectorRegistry, *labels: str) -> Counter:
    """The request counter: ``labels`` (such as ``model``) first, then route, method, status."""
    return Counter("mlxbun_http_requests", "HTTP requests answered, by route template, "
                   "method and status", [*labels, "route", "method", "status"],
                   registry=registry)


def metrics_response(registry: CollectorRegistry) -> Response:
    """The registry in Prometheus' text format (0.0.4, which every scraper reads)."""
    return Response(200, None, Content(CONTENT_TYPE.encode(), generate_latest(registry)))


def install(app, engine) -> CollectorRegistry:
    """Give ``app`` a registry with ``engine``'s series and a request counter, and the
    ``GET /metrics`` route."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(for_engine(engine))
    requests = request_counter(registry, "model")
    model = str(engine.model.id)
    app.state.metrics = registry

    async def metrics(request: Request) -> Response:
        return metrics_response(registry)

    app.router.add_get(PATH, metrics)

    async def count_routes(application) -> None:
        for method, route in application.router.iter_with_methods():
            # a WebSocket handshake has no HTTP status to count; a restarted app is wrapped once
            if method != "GET_WS" and not getattr(route.handler, "counted", False):
                route.handler = counted(route.handler, route_label(route.pattern),
                                        requests, model)

    app.after_start += count_routes
    return registry


def route_label(pattern) -> str:
    text = pattern.decode("latin-1") if isinstance(pattern, bytes) else str(pattern)
    return OTHER_ROUTE if text in ("*", "") else text


def counted(handler, route: str, requests: Counter, model: str):
    """``handler`` (the route's middleware chain), counting each answer's status."""

    @functools.wraps(handler)
    async def inner(request: Request) -> Response | None:
        status = 500
        try:
            response = await handler(request)
            status = response.status if response is not None else 204
            return response
        except HTTPException as exc:
            status = exc.status
            raise
        finally:
            requests.labels(model, route, request.method, str(status)).inc()

    setattr(inner, "counted", True)  # noqa: B010 (the marker count_routes looks for)
    return inner
