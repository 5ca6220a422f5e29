"""LoRA adapters for tests, written with mlx-lm's own LoRA layers.

:func:`write_lora_adapter` converts a tiny checkpoint's layers with
``mlx_lm.tuner.utils.linear_to_lora_layers`` (what ``mlx_lm.lora`` trains), fills
both factors with non-zero random values (a fresh LoRA has ``lora_b = 0`` and would
change nothing), and saves the directory the way mlx-lm's trainer does.
:func:`write_peft_copy` writes the same adapter in PEFT's layout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast


def write_lora_adapter(model_path, out, *, seed: int = 1, rank: int = 4, scale: float = 2.0,
                       num_layers: int = -1, keys: Sequence[str] | None = None,
                       magnitude: float = 0.5, base_model: str | None = None) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load, save_config

    model = load(str(model_path))[0]
    model.freeze()
    params: dict[str, Any] = {"rank": rank, "scale": scale, "dropout": 0.0}
    if keys is not None:
        params["keys"] = list(keys)
    linear_to_lora_layers(model, num_layers, params)
    key = mx.random.key(seed)
    weights = {}
    leaves = cast("list[tuple[str, mx.array]]", tree_flatten(model.trainable_parameters()))
    for name, value in sorted(leaves, key=lambda leaf: leaf[0]):
        key, sub = mx.random.split(key)
        weights[name] = (mx.random.normal(value.shape, key=sub) * magnitude
                         / value.shape[0] ** 0.5).astype(mx.float32)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    save_config({"model": str(base_model or model_path), "fine_tune_type": "lora",
                 "num_layers": num_layers, "lora_parameters": params},
                out / "adapter_config.json")
    return out


def write_peft_copy(mlx_adapter, out, *, base_model: str | None = None,
                    use_rslora: bool = False) -> Path:
    """The same LoRA in PEFT's layout (``lora_A.weight`` (r, in), ``lora_B.weight``
    (out, r), ``lora_alpha``); the scale is kept exactly."""
    import mlx.core as mx

    src = Path(mlx_adapter)
    cfg = json.loads((src / "adapter_config.json").read_text())
    rank, scale = cfg["lora_parameters"]["rank"], cfg["lora_parameters"]["scale"]
    weights = cast("dict[str, mx.array]", mx.load(str(src / "adapters.safetensors")))
    peft = {}
    for name, value in weights.items():
        module, leaf = name.rsplit(".", 1)
        which = "lora_A" if leaf == "lora_a" else "lora_B"
        peft[f"base_model.model.{module}.{which}.weight"] = mx.contiguous(value.T)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapter_model.safetensors"), peft,
                        metadata={"format": "pt"})
    alpha = scale * (rank ** 0.5 if use_rslora else rank)
    targets = sorted({n.split(".")[-3] for n in peft})
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": use_rslora,
        "target_modules": targets, "lora_dropout": 0.0, "bias": "none",
        "base_model_name_or_path": str(base_model or cfg["model"]),
        "task_type": "CAUSAL_LM"}, indent=2))
    return out
