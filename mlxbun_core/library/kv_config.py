"""What ``fit --kv-quant config`` bills: the per-layer bits of a model's ``kv_config.json``,
read by the same parser ``serve --kv-quant config`` uses (:mod:`mlxbun_core.kvquant.config`,
mlx-optiq's format), checked against the model's layer count."""

from __future__ import annotations

from pathlib import Path

from ..kvquant.config import FILENAME, load

FILE = FILENAME
LayerBits = tuple[tuple[int, int] | None, ...]  # per layer: (bits, group size) or unquantized


def read(model_dir: Path, layers: int) -> LayerBits:
    """The per-layer scheme for ``layers`` decoder layers; ValueError saying what is wrong."""
    path, rules = load("config", model_dir)
    out: list[tuple[int, int] | None] = [None] * layers
    for i, bits, group in rules:
        if i >= layers:
            raise ValueError(f"{path}: layer {i} is outside the model's {layers} layers")
        out[i] = (bits, group) if bits else None
    return tuple(out)
