"""Prometheus metrics (``GET /metrics``): request counts per route, per-request latency
histograms and token counters, and gauges read from the engine at scrape time.

- :mod:`.engine`: one engine's series (:func:`for_engine` makes them and has the engine
  record every generation as it ends; the batch lane's occupancy comes from its
  ``engine.lanes.tally.StepTally``).
- :mod:`.http`: the per-app registry, the request counter and the route.
- :mod:`.isolate`: the ``--isolate`` parent's ``/metrics``: its own series plus every
  ready engine child's, merged.

docs/server.md lists every metric and its labels.
"""

from .engine import EngineMetrics, for_engine
from .http import install

__all__ = ["EngineMetrics", "for_engine", "install"]
