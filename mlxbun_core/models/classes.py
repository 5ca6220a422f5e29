"""An architecture's model classes from its config, through mlx-lm's public names only
(its model modules and remapping tables), for building a model without loading weights."""

from __future__ import annotations

import importlib
from typing import Any


def model_classes(config: dict[str, Any]) -> tuple[Any, Any]:
    """``(Model, ModelArgs)`` of ``config``'s architecture, as mlx-lm's loader picks them
    (a ValueError when mlx-lm has no such model type)."""
    from mlx_lm import utils

    model_type = str(config["model_type"])
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    by_arch = getattr(utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    remapped = next((by_arch[(model_type, a)] for a in architectures
                     if (model_type, a) in by_arch), None)
    model_type = remapped or utils.MODEL_REMAPPING.get(model_type, model_type)
    try:
        arch = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError as exc:
        raise ValueError(f"Model type {model_type} not supported.") from exc
    return arch.Model, arch.ModelArgs


def cache_classes() -> tuple[type, ...]:
    """mlx-lm's public KV cache classes (every cache an architecture makes is one of them
    or a subclass): their common base is private, so ``isinstance`` takes this tuple."""
    from mlx_lm.models import cache

    return tuple(v for k, v in vars(cache).items()
                 if not k.startswith("_") and isinstance(v, type)
                 and callable(getattr(v, "from_state", None)) and hasattr(v, "state"))
