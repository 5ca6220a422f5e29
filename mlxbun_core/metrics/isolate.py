"""``/metrics`` of the ``--isolate`` parent: its own series plus every engine child's.

The parent runs no model, so the engine series come from its children: at scrape time it
asks each resident engine's ``/metrics`` over the engine's unix socket (concurrently,
each bounded by :data:`SCRAPE_TIMEOUT_S`), adds ``model="<the engine's model id>"`` to
any series that lacks it, and merges same-named families into one exposition. It never
starts or wakes an engine to be scraped, and a scrape does not count as use (the pool's
least-recently-used order is left alone).

Requests: a proxied request is counted by the engine that answered it (its own route
templates, its ``model`` label); the parent counts only what it answers itself
(``/health``, ``/v1/models``, the guard's refusals, ``502 engine_unavailable``...), with no
``model`` label, so no request is ever counted twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from .http import CONTENT_TYPE, OTHER_ROUTE, request_counter


class _Engine(Protocol):
    """What a scrape reads of one of the pool's engines (``isolate.pool.PooledEngine``)."""

    @property
    def model_id(self) -> str: ...
    @property
    def restarts(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def state(self) -> str: ...


class EnginePool(Protocol):
    """What the metrics read of the isolation pool (``isolate.pool.EnginePool``, a room
    above this one)."""

    @property
    def engines(self) -> Mapping[str, _Engine]: ...
    @property
    def evictions(self) -> int: ...
    @property
    def cap(self) -> int: ...

log = logging.getLogger("mlxbun.metrics")

SCRAPE_TIMEOUT_S = 5.0


class _Families(Collector):
    """Already-built families, for ``generate_latest``."""

    def __init__(self, families: Iterable[Metric]):
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class PoolCollector(Collector):
    """The engine pool as the parent sees it (read at scrape time)."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.up: dict[str, bool] = {}  # model id -> whether its last scrape answered

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("mlxbun_engine_up", "1 when the engine answered this scrape",
                               labels=["model"])
        restarts = CounterMetricFamily("mlxbun_engine_restarts", "Times the engine child was "
                                       "respawned after dying", labels=["model"])
        in_flight = GaugeMetricFamily("mlxbun_engine_in_flight", "Requests the parent is "
                                      "proxying to the engine now", labels=["model"])
        for engine in list(self.pool.engines.values()):
            model = engine.model_id
            up.add_metric([model], 1.0 if self.up.get(model) else 0.0)
            restarts.add_metric([model], float(engine.restarts))
            in_flight.add_metric([model], float(engine.in_flight))
        yield from (up, restarts, in_flight)
        evictions = CounterMetricFamily("mlxbun_pool_evictions", "Engines drained to make room "
                                        "under --model-pool")
        evictions.add_metric([], float(self.pool.evictions))
        yield evictions
        cap = GaugeMetricFamily("mlxbun_pool_engines_max", "Engines that may be resident "
                                "(--model-pool)")
        cap.add_metric([], float(self.pool.cap))
        yield cap


class ParentMetrics:
    """The parent's registry and its merged scrape."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = request_counter(self.registry)
        self.engines = PoolCollector(pool)
        self.registry.register(self.engines)

    def count(self, route: str, method: str, status: int) -> None:
        """One request the parent answered itself."""
        self.requests.labels(route, method, str(status)).inc()

    async def render(self) -> tuple[bytes, bytes]:
        """(content type, body): every ready engine's series merged with the parent's."""
        engines = [e for e in list(self.pool.engines.values()) if e.state == "ready"]
        texts = await asyncio.gather(*(scrape(e) for e in engines))
        merged: dict[str, Metric] = {}  # family name -> merged family
        up: dict[str, bool] = {}
        for engine, text in zip(engines, texts):
            families = parse(text, engine.model_id) if text is not None else None
            up[engine.model_id] = families is not None
            if families is not None:
                merge(merged, families, engine.model_id)
        self.engines.up = up
        merge(merged, self.registry.collect(), None)
        return CONTENT_TYPE.encode(), generate_latest(_Families(merged.values()))


async def scrape(engine) -> str | None:
    """The engine's own exposition, or None when it does not answer in time."""
    try:
        r = await engine.client.get("/metrics", timeout=SCRAPE_TIMEOUT_S)
    except Exception as exc:  # a dying engine: it shows as mlxbun_engine_up 0
        log.debug("scraping engine %s failed: %s", engine.model_id, exc)
        return None
    if r.status_code != 200:
        log.debug("scraping engine %s: HTTP %d", engine.model_id, r.status_code)
        return None
    return r.text


def parse(text: str, model: str) -> list | None:
    """An engine's exposition as families; None (and a log line) when it does not parse."""
    try:
        return list(text_string_to_metric_families(text))
    except Exception as exc:
        log.warning("engine %s sent metrics that do not parse: %s", model, exc)
        return None


def merge(into: dict, families: Iterable[Metric], model: str | None) -> None:
    """Add ``families`` to ``into`` (name -> Metric); with ``model``, label every sample
    that has no ``model`` label yet."""
    for fam in families:
        samples = fam.samples
        if model is not None:
            samples = [s._replace(labels={**s.labels, "model": model})
                       if "model" not in s.labels else s for s in samples]
        have = into.get(fam.name)
        if have is None:
            have = into[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        have.samples.extend(samples)


def route_of(path: str, local_routes: Iterable[str]) -> str:
    """A bounded route label for a request the parent answers: one of its own route
    templates (``/v1/models/*`` for any model id), else ``other``."""
    for route in local_routes:
        if path == route or (route.endswith("/*") and path.startswith(route[:-1])):
            return route
    return OTHER_ROUTE
