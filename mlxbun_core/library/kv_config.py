"""A model's ``kv_config.json``: per-layer KV-cache bits, as mixed-precision (optiq-style)
checkpoints ship them; what ``fit --kv-quant config`` bills.

Accepted shapes (every one maps a decoder layer index to bits, optionally a group size):
``{"layers": {...}|[...], "default_bits"?: N, "group_size"?: G}``, a bare ``{"3": 8, ...}``
mapping, or a list with one entry per layer. An entry is bits (``4``), ``{"bits", "group_size"?}``,
or ``null``/``0``/``16`` for a layer kept at the activation dtype. Layers it does not name take
``default_bits`` (else stay unquantized).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE = "kv_config.json"
LayerBits = tuple[tuple[int, int] | None, ...]  # per layer: (bits, group size) or unquantized


def read(model_dir: Path, layers: int) -> LayerBits:
    """The per-layer scheme for ``layers`` decoder layers; ValueError saying what is wrong."""
    path = Path(model_dir) / FILE
    if not path.is_file():
        raise ValueError(f"--kv-quant config needs the model's {FILE}; {model_dir} has none "
                         "(use 4 or 8 for uniform bits)")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    group, default = 64, None
    entries: Any = data
    if isinstance(data, dict) and "layers" in data:
        entries, group = data["layers"], int(data.get("group_size") or 64)
        default = data.get("default_bits")
    out: list[tuple[int, int] | None] = [_entry(default, group, path)] * layers
    pairs = entries.items() if isinstance(entries, dict) else enumerate(entries)
    for key, value in pairs:
        try:
            i = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: layer key {key!r} is not a layer index") from None
        if not 0 <= i < layers:
            raise ValueError(f"{path}: layer {i} is outside the model's {layers} layers")
        out[i] = _entry(value, group, path)
    return tuple(out)


def _entry(value: Any, group: int, path: Path) -> tuple[int, int] | None:
    if isinstance(value, dict):
        group, value = int(value.get("group_size") or group), value.get("bits")
    if value in (None, 0, 16):
        return None
    if value not in (2, 3, 4, 5, 6, 8):
        raise ValueError(f"{path}: {value!r} is not KV bits (2, 3, 4, 5, 6 or 8)")
    return int(value), group
