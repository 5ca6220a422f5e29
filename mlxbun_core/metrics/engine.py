"""An engine's metrics: what one request reports when it ends, and what the engine's state
says at scrape time.

Two kinds of numbers, paid for differently:

- **Per request** (histograms and token counters): recorded once, when a generation ends,
  from its :class:`~mlxbun_core.events.Finish` (the session's own timings and usage).
  :func:`for_engine` sets the engine's ``on_finish`` to :meth:`EngineMetrics.finished`, and
  the engine hands that to every job it starts; nothing is recorded per token.
- **Scrape time** (gauges, and counters the engine keeps anyway): read from the engine
  (worker queues, lanes, prefix cache, admission, MLX's allocator) only when ``/metrics``
  is asked, so the hot path pays nothing for them. The batch lane's occupancy comes from
  the :class:`~mlxbun_core.engine.lanes.tally.StepTally` it bumps once per decode step.

The metrics stand above the engine: they read it, it never imports them.

Every series carries ``model`` (the served model's id); under ``--isolate`` the parent
merges its engines' series, which the label keeps apart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..engine.lanes.tally import StepTally

log = logging.getLogger("mlxbun.metrics")

# seconds from queueing (prompt rendered and tokenized) to the first generated token
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
# mean seconds between output tokens of one request (after its first)
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                 60.0, 120.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0,
                    640.0)


class EngineMetrics(Collector):
    """One engine's series; registered into each app's registry that serves the engine."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.model = str(engine.model.id)
        m = ["model"]
        self._ttft = Histogram("mlxbun_time_to_first_token_seconds",
                               "Seconds from queueing to the first generated token",
                               m, buckets=TTFT_BUCKETS, registry=None)
        self._tpot = Histogram("mlxbun_time_per_output_token_seconds",
                               "Mean seconds between a request's output tokens after its first",
                               m, buckets=TPOT_BUCKETS, registry=None)
        self._queue = Histogram("mlxbun_request_queue_seconds",
                                "Seconds a request waited before a lane took it",
                                m, buckets=QUEUE_BUCKETS, registry=None)
        self._duration = Histogram("mlxbun_request_duration_seconds",
                                   "Seconds from queueing to the end of a generation",
                                   m, buckets=DURATION_BUCKETS, registry=None)
        self._finished = Counter("mlxbun_requests_finished", "Generations ended, by how "
                                 "they ended and the lane that ran them",
                                 ["model", "reason", "lane"], registry=None)
        self._prompt = Counter("mlxbun_prompt_tokens", "Prompt tokens of ended generations",
                               m, registry=None)
        self._cached = Counter("mlxbun_prompt_tokens_cached", "Prompt tokens served from the "
                               "prefix cache", m, registry=None)
        self._completion = Counter("mlxbun_completion_tokens", "Tokens generated",
                                   m, registry=None)
        self._recorded = (self._ttft, self._tpot, self._queue, self._duration, self._finished,
                          self._prompt, self._cached, self._completion)
        label = self.model
        self._ttft_m, self._tpot_m = self._ttft.labels(label), self._tpot.labels(label)
        self._queue_m, self._duration_m = self._queue.labels(label), self._duration.labels(label)
        self._prompt_m, self._cached_m = self._prompt.labels(label), self._cached.labels(label)
        self._completion_m = self._completion.labels(label)

    # -- per request (the worker thread, once per generation) ---------------------------
    def finished(self, fin) -> None:
        """Record one ended generation; never raises into the engine."""
        try:
            u, t = fin.usage, fin.timings
            self._finished.labels(self.model, fin.reason, u.lane or "none").inc()
            self._prompt_m.inc(u.prompt_tokens)
            self._cached_m.inc(u.cached_tokens)
            self._completion_m.inc(u.completion_tokens)
            if "admission_wait_s" in t:
                self._queue_m.observe(t["admission_wait_s"])
            if "total_s" in t:
                self._duration_m.observe(t["total_s"])
            ttft = t.get("ttft_s")
            if ttft is not None:
                self._ttft_m.observe(ttft)
                if u.completion_tokens > 1 and "total_s" in t:
                    self._tpot_m.observe((t["total_s"] - ttft) / (u.completion_tokens - 1))
        except Exception:  # a metrics bug must never fail a request
            log.exception("recording a finished generation failed")

    # -- scrape time ---------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        for metric in self._recorded:
            yield from metric.collect()
        yield from self._state()

    def _gauge(self, name: str, doc: str, value) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model"])
        g.add_metric([self.model], float(value or 0))
        return g

    def _counter(self, name: str, doc: str, value) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model"])
        c.add_metric([self.model], float(value or 0))
        return c

    def _state(self) -> Iterator[Metric]:
        e, g, c = self.engine, self._gauge, self._counter
        worker = e.worker
        yield g("mlxbun_requests_running", "Generations decoding now (every lane)", worker.active)
        yield g("mlxbun_requests_waiting", "Generations queued for a lane (queue depth)",
                worker.waiting)
        yield g("mlxbun_requests_waiting_max", "Queue depth past which requests get a 429",
                worker.max_waiting)
        batch = next((lane for lane in worker.lanes if lane.name == "batched"), None)
        yield g("mlxbun_batch_rows_max", "Rows the batch lane decodes together at most", e.batch)
        yield g("mlxbun_batch_rows_running", "Rows in the batch lane now",
                batch.active if batch is not None else 0)
        tally = getattr(batch, "steps", None)
        if isinstance(tally, StepTally):
            yield c("mlxbun_batch_decode_steps", "Decode steps of the batch lane", tally.steps)
            yield c("mlxbun_batch_decode_rows", "Rows carried by the batch lane's decode steps "
                    "(divided by the steps: mean batch occupancy)", tally.rows)
        spec = getattr(e, "spec_tally", None)
        if spec is not None:
            yield c("mlxbun_speculation_drafted", "Prompt-lookup draft tokens sent to verify",
                    spec.drafted)
            yield c("mlxbun_speculation_accepted", "Prompt-lookup draft tokens accepted",
                    spec.accepted)
            yield c("mlxbun_speculation_rounds", "Draft rounds verified (per request)",
                    spec.rounds)
            yield c("mlxbun_speculation_batch_steps", "Batch-lane steps that verified drafts",
                    spec.batch_steps)
            yield c("mlxbun_speculation_requests", "Requests decoded with prompt lookup",
                    spec.requests)
        yield from self._prefix(e.prefix.stats())
        yield from self._memory(e.admission.stats())
        yield from self._pressure(e.memory_stats(), e.batch_stats().get("kv_blocks") or {})

    def _prefix(self, s: dict) -> Iterator[Metric]:
        g, c = self._gauge, self._counter
        yield c("mlxbun_prefix_cache_lookups", "Prefix-cache lookups", s.get("lookups"))
        yield c("mlxbun_prefix_cache_hits", "Prefix-cache lookups that reused cached KV",
                s.get("hits"))
        yield g("mlxbun_prefix_cache_bytes", "Bytes of KV held by the prefix cache",
                s.get("bytes"))
        yield g("mlxbun_prefix_cache_max_bytes", "The prefix cache's byte cap",
                s.get("max_bytes"))
        yield g("mlxbun_prefix_cache_entries", "Entries in the prefix cache", s.get("entries"))

    def _memory(self, s: dict) -> Iterator[Metric]:
        g = self._gauge
        active, cached = mlx_memory()
        yield g("mlxbun_memory_active_bytes", "Bytes MLX has allocated now", active)
        yield g("mlxbun_memory_cache_bytes", "Bytes MLX keeps cached for reuse", cached)
        yield g("mlxbun_memory_budget_bytes", "The memory budget admission works within",
                s.get("budget_bytes"))
        yield g("mlxbun_memory_weights_bytes", "Bytes of the model's weights",
                s.get("weights_bytes"))
        yield g("mlxbun_memory_kv_reserved_bytes", "KV bytes reserved by running requests",
                s.get("reserved_kv_bytes"))
        yield self._counter("mlxbun_memory_waits", "Times a request waited for memory",
                            s.get("memory_waits"))


    def _pressure(self, s: dict, blocks: dict) -> Iterator[Metric]:
        """The KV pool's blocks and what memory pressure did (``engine/memory.py``)."""
        g, c = self._gauge, self._counter
        for state in ("free", "used", "shared", "swapped"):
            yield g(f"mlxbun_kv_blocks_{state}", f"KV blocks of the batch's pool: {state}",
                    blocks.get(state))
        yield g("mlxbun_kv_blocks_limit", "KV blocks the pool may grow to now (the memory "
                "free now and admission's budget)", blocks.get("limit"))
        yield g("mlxbun_memory_available_bytes", "Memory the engine may still allocate, "
                "as last measured (the safety margin kept back)", s.get("available_bytes"))
        yield c("mlxbun_memory_preemptions", "Requests preempted for memory (recomputed "
                "later)", s.get("preemptions"))
        yield c("mlxbun_memory_retries", "Steps that failed for memory and were retried",
                s.get("retries"))
        yield c("mlxbun_memory_refused", "Requests answered 503 for memory (Retry-After)",
                s.get("refused"))
        yield c("mlxbun_memory_out_of_memory", "Out-of-memory failures MLX raised",
                s.get("out_of_memory"))
        yield c("mlxbun_device_faults", "Device faults the engine could not recover from",
                s.get("device_faults"))
        yield c("mlxbun_memory_cache_given_back", "Times MLX's cache went back to the device "
                "because the reading was short", s.get("cache_given_back"))
        yield c("mlxbun_kv_pool_releases", "Times an idle batch lane gave its memory back",
                blocks.get("idle_releases"))
        yield c("mlxbun_kv_pool_pressure_trims", "Times a busy pool gave its free top back "
                "for memory", blocks.get("pressure_trims"))
        yield c("mlxbun_kv_pool_released_bytes", "Bytes the KV pool gave back, idle or short",
                blocks.get("released_bytes"))


def mlx_memory() -> tuple[int, int]:
    """MLX's allocator: bytes in use and bytes cached (0, 0 where MLX cannot say)."""
    try:
        import mlx.core as mx

        return int(mx.get_active_memory()), int(mx.get_cache_memory())
    except Exception:
        return 0, 0


def for_engine(engine: Any) -> EngineMetrics:
    """The engine's one :class:`EngineMetrics` (made on first use), which from then on
    records every generation the engine starts (``engine.on_finish``)."""
    metrics = getattr(engine, "prom_metrics", None)
    if not isinstance(metrics, EngineMetrics):
        metrics = engine.prom_metrics = EngineMetrics(engine)
        engine.on_finish = metrics.finished
    return metrics
