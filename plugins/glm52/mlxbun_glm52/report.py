"""The ``glm52`` blocks of ``GET /stats`` and ``GET /fit`` (the ``model_report`` hook).

Shapes follow the wire reference where we can fill them honestly; what this runtime
does not have (MTP drafting, a measured oracle rate) is ``null``.
"""

from __future__ import annotations

from typing import Any

from mlxbun_core.model import LoadedModel
from mlxbun_core.models.facts import weight_bytes

from .experts import ExpertIndex
from .streaming import Streaming


def _slabs(model: LoadedModel, may_scan: bool) -> dict[str, int | None]:
    """Routed-expert bytes of the main layers and of the MTP layers after them, from the
    safetensors headers (kept on the model once known). ``/stats`` runs on the event loop
    and never scans: a resident model's main slab then comes from its loaded experts."""
    known = model.extras.get("expert_slabs")
    if isinstance(known, dict):
        return known
    streaming = model.extras.get("expert_streaming")
    index = streaming.index if isinstance(streaming, Streaming) else None
    if index is None and not may_scan:
        return {"main_expert_slab_bytes": _resident_expert_bytes(model),
                "mtp_expert_slab_bytes": None}
    index = index or ExpertIndex.scan(model.path)
    main = int(model.config.get("num_hidden_layers", 0))
    layers = {k[0] for k in index.parts}
    slabs: dict[str, int | None] = {
        "main_expert_slab_bytes": index.layer_bytes(li for li in layers if li < main),
        "mtp_expert_slab_bytes": index.layer_bytes(li for li in layers if li >= main),
        "artifact_disk_bytes": index.disk_bytes}
    model.extras["expert_slabs"] = slabs
    return slabs


def _resident_expert_bytes(model: LoadedModel) -> int:
    return sum(weight_bytes(layer.mlp.switch_mlp) for layer in model.model.model.layers
               if hasattr(layer.mlp, "switch_mlp"))


def _resident(model: LoadedModel) -> int:
    if "resident_weight_bytes" not in model.extras:
        model.extras["resident_weight_bytes"] = weight_bytes(model.model)
    return int(model.extras["resident_weight_bytes"])


def stats_block(model: LoadedModel) -> dict[str, Any]:
    streaming = model.extras.get("expert_streaming")
    runtime, budget = None, None
    if isinstance(streaming, Streaming):
        budget = streaming.cache.budget_bytes
        snap = streaming.cache.snapshot()
        runtime = {"main_residency": {"resident": snap["resident_experts"], "pinned": 0,
                                      "working": snap["working_experts"],
                                      "hits": snap["hits"], "misses": snap["misses"],
                                      "evictions": snap["evictions"]},
                   "mtp_residency": None, **snap}
    return {"expert_streaming": runtime is not None,
            "expert_budget_bytes": budget,
            "resident_weight_bytes": _resident(model), "mtp": False,
            **{k: v for k, v in _slabs(model, False).items() if k != "artifact_disk_bytes"},
            "dsa": True, "expert_runtime": runtime}


def fit_block(model: LoadedModel) -> dict[str, Any]:
    streaming = model.extras.get("expert_streaming")
    return {**_slabs(model, True),
            "resident_weight_bytes": _resident(model),
            "expert_budget_bytes": (streaming.cache.budget_bytes
                                    if isinstance(streaming, Streaming) else None),
            "max_generation_tokens": None, "direct_oracle_warm_decode_tps": None,
            "aspirational_decode_tps": None}
