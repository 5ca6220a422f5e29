"""Prometheus metrics (``GET /metrics``): request counts per route, per-request latency
histograms and token counters, and gauges read from the engine at scrape time.

- :mod:`.engine`: one engine's series (:func:`track` records a generation when it ends;
  :class:`StepTally` is the batch lane's occupancy counter).
- :mod:`.http`: the per-app registry, the request counter and the route.
- :mod:`.isolate`: the ``--isolate`` parent's ``/metrics``: its own series plus every
  ready engine child's, merged.

docs/server.md lists every metric and its labels.
"""

from .engine import EngineMetrics, StepTally, for_engine, track
from .http import install

__all__ = ["EngineMetrics", "StepTally", "for_engine", "install", "track"]
