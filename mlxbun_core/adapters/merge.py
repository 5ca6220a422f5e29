"""Fold two LoRA adapters into one, exactly: ``s1·x·A1·B1 + s2·x·A2·B2`` equals
``x·[A1 A2]·[s1·B1; s2·B2]``, so the factors are concatenated along the rank with
the scales folded into ``B`` (scale 1). Layers only one adapter touches are padded
with zero factors, keeping one rank for every layer as mlx-lm's loader expects.
The result is an mlx-lm adapter directory (any input format: mlx-lm or PEFT).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import BadRequest
from . import formats
from .layers import rank_of


def merge(path_a: Path, path_b: Path, out: Path, scales: list | None = None) -> dict:
    """Write the merged adapter to ``out``; returns the spec's ``stats``."""
    import mlx.core as mx

    infos = [formats.read_info(p) for p in (path_a, path_b)]
    parts = [formats.load_tensors(i) for i in infos]
    if scales is not None:
        if (not isinstance(scales, list) or len(scales) != 2
                or not all(isinstance(s, (int, float)) and not isinstance(s, bool)
                           for s in scales)):
            raise BadRequest("scales must be a list of two numbers", param="scales")
        parts = [{m: (a, b, float(s)) for m, (a, b, _) in p.items()}
                 for p, s in zip(parts, scales)]
    ranks = [max(rank_of(a) for a, _, _ in p.values()) for p in parts]
    if any(a.ndim != 2 for p in parts for a, _, _ in p.values()):
        raise BadRequest("merging expert (switch) LoRA layers is not supported")
    weights, both = {}, 0
    for module in sorted(parts[0].keys() | parts[1].keys()):
        pieces = [p.get(module) for p in parts]
        dims = {(x[0].shape[0], x[1].shape[1]) for x in pieces if x is not None}
        if len(dims) > 1:
            raise BadRequest(f"the adapters do not fit the same model: {module} has "
                             f"shapes {sorted(dims)}")
        (in_dims, out_dims), = dims
        a_cols, b_rows = [], []
        for piece, rank in zip(pieces, ranks):
            if piece is None:
                a, b, s = mx.zeros((in_dims, rank)), mx.zeros((rank, out_dims)), 1.0
            else:
                a, b, s = piece
                pad = rank - rank_of(a)
                if pad:
                    a = mx.concatenate([a, mx.zeros((in_dims, pad), dtype=a.dtype)], axis=1)
                    b = mx.concatenate([b, mx.zeros((pad, out_dims), dtype=b.dtype)], axis=0)
            a_cols.append(a.astype(mx.float32))
            b_rows.append((s * b).astype(mx.float32))
        both += all(x is not None for x in pieces)
        weights[f"{module}.lora_a"] = mx.concatenate(a_cols, axis=1)
        weights[f"{module}.lora_b"] = mx.concatenate(b_rows, axis=0)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / formats.MLX_WEIGHTS), weights)
    base = infos[0].base_model or infos[1].base_model
    config = {"fine_tune_type": "lora", "num_layers": -1,
              "lora_parameters": {"rank": sum(ranks), "scale": 1.0, "dropout": 0.0},
              "merged_from": [str(i.path) for i in infos]}
    if base:
        config["model"] = base
    (out / formats.CONFIG).write_text(json.dumps(config, indent=2))
    used = [scales[i] if scales else infos[i].scale for i in range(2)]
    return {"layersMerged": both, "layersOnlyInOne": len(weights) // 2 - both,
            "totalKeysOut": len(weights), "sources": [str(i.path) for i in infos],
            "scales": used}


def export_manifest(base_model: str, adapter: Path, out: Path, method: str | None) -> dict:
    """Describe an adapter for shipping: ``manifest.json`` in ``out``."""
    manifest = {"version": 1, "base_model": base_model, "adapter_path": str(adapter),
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if method:
        manifest["method"] = method
    info = formats.read_info(adapter)
    manifest.update(format=info.format, rank=info.rank, scale=info.scale)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
