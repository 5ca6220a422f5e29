"""Sizes and settings a model states, for the library and for family plugins alike: the
language model's part of a config, the bytes of its activation dtype, and the bytes of
a loaded module's parameters. It stands on the floor of model files, below the plugins,
so a family's reports and heads bill memory the way admission and ``mlxbun fit`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
               "float64": 8, "int8": 1, "uint8": 1}


def text_config(config: dict) -> dict:
    """The language model's config: ``text_config`` of a multimodal checkpoint, else itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and inner else config


DTYPE_ALIASES = {"float": "float32", "half": "float16"}


def activation_dtype(config: dict) -> str:
    """The activation dtype's name, from the config's ``torch_dtype``/``dtype`` (default
    bfloat16): what an unquantized KV cache holds, so reports name what they bill."""
    for c in (text_config(config), config):
        for key in ("torch_dtype", "dtype"):
            v = c.get(key)
            if isinstance(v, str) and v.replace("torch.", "") in DTYPE_BYTES:
                name = v.replace("torch.", "")
                return DTYPE_ALIASES.get(name, name)
    return "bfloat16"


def activation_bytes(config: dict) -> int:
    """Bytes per activation element, from the config's ``torch_dtype``/``dtype`` (default 2)."""
    return DTYPE_BYTES[activation_dtype(config)]


def weight_bytes(module: nn.Module) -> int:
    """Bytes of a model's parameters (shape arithmetic only: nothing is evaluated)."""
    from mlx.utils import tree_flatten

    leaves = cast("list[tuple[str, mx.array]]", tree_flatten(module.parameters()))
    return sum(v.nbytes for _, v in leaves)
