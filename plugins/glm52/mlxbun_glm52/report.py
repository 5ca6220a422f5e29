"""The ``glm52`` blocks of ``GET /stats`` and ``GET /fit`` (the ``model_report`` hook).

Shapes follow the wire reference where we can fill them honestly; what this runtime
does not have (MTP drafting, a measured oracle rate) is ``null``.
"""

from __future__ import annotations

from typing import Any

from mlxbun_core.engine.admission import weight_bytes
from mlxbun_core.model import LoadedModel

from .experts import ExpertIndex
from .streaming import Streaming


def _index(model: LoadedModel) -> ExpertIndex:
    """The checkpoint's expert byte ranges (headers only), kept on the model."""
    streaming = model.extras.get("expert_streaming")
    if isinstance(streaming, Streaming):
        return streaming.index
    index = model.extras.get("expert_index")
    if not isinstance(index, ExpertIndex):
        index = model.extras["expert_index"] = ExpertIndex.scan(model.path)
    return index


def _slabs(model: LoadedModel) -> dict[str, int]:
    index, main = _index(model), int(model.config.get("num_hidden_layers", 0))
    layers = {k[0] for k in index.parts}
    return {"main_expert_slab_bytes": index.layer_bytes(li for li in layers if li < main),
            "mtp_expert_slab_bytes": index.layer_bytes(li for li in layers if li >= main)}


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
            "resident_weight_bytes": _resident(model), **_slabs(model), "mtp": False,
            "dsa": True, "expert_runtime": runtime}


def fit_block(model: LoadedModel) -> dict[str, Any]:
    streaming = model.extras.get("expert_streaming")
    return {"artifact_disk_bytes": _index(model).disk_bytes, **_slabs(model),
            "resident_weight_bytes": _resident(model),
            "expert_budget_bytes": (streaming.cache.budget_bytes
                                    if isinstance(streaming, Streaming) else None),
            "max_generation_tokens": None, "direct_oracle_warm_decode_tps": None,
            "aspirational_decode_tps": None}
