"""What the engine reports on ``/stats`` (``speculation``, ``kv_quant``, ``batch``), read
off a running :class:`~mlxbun_core.engine.core.Engine` (typed ``Any`` here: the engine
imports this module)."""

from __future__ import annotations

from typing import Any

from .. import kvquant
from ..library import fit
from . import warmup
from .speculate import MTP


def lookup(engine: Any) -> dict[str, Any]:
    """``/stats`` ``speculation`` without a draft model: the server's prompt-lookup
    default (None: off unless a request asks) and what every request's lookup did."""
    spec = engine.speculation
    return {"ngram": spec.describe() if spec and spec.kind != MTP else None,
            "mtp": None if engine.predictor is None else
            {"head": engine.predictor.name, "default": spec is not None and spec.kind == MTP},
            **engine.spec_tally.describe()}


def kv_quant(engine: Any) -> dict[str, Any]:
    """``/stats`` ``kv_quant``: the scheme and what each layer's cache holds."""
    return kvquant.describe(engine.kv, engine.admission.layout,
                            fit.activation_dtype(engine.model.config or {}),
                            warmup.kv_eligible(engine.model, engine.kv))


def batch(engine: Any) -> dict[str, Any]:
    """``/stats`` ``batch``: the cap, the lanes, the pool, pacing and the KV budget."""
    lanes = {lane.name: {"active": lane.active, "waiting": lane.waiting}
             for lane in engine.worker.lanes}
    pools = [p for lane in engine.worker.lanes
             if (p := getattr(lane, "pool_stats", lambda: None)()) is not None]
    return {"cap": engine.batch, "cap_source": engine.batch_source,
            "auto": engine.batch_plan.describe() if engine.batch_plan else None,
            "active_rows": engine.worker.active, "waiting": engine.worker.waiting,
            "lanes": lanes, "prefill": engine.pacer.stats(), "adapters": engine.adapters.stats(),
            "kv_blocks": pools[0] if pools else None, "warmup": engine.warmup,
            # --kv-budget: the rows' reserved worst-case KV against its cap (None: off)
            "kv_bytes": engine.admission.reserved_bytes,
            "kv_budget_bytes": engine.admission.kv_budget_bytes,
            "kv_budget_waits": engine.admission.kv_budget_waits}
