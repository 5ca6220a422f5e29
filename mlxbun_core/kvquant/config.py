"""``kv_config.json``: mlx-optiq's per-layer KV bits (``--kv-quant config``).

The file is optiq's: a JSON list of ``{"layer_idx": i, "bits": b, "group_size": g}``,
one entry per cache index of the model (``make_prompt_cache``'s order), ``bits`` 0
meaning the layer keeps its dtype and ``group_size`` 64 when left out. Besides optiq's
single index, an entry may name a group of layers: ``"layers": [0, 1, 2]`` or a range
string ``"layers": "0-3,6"``. Layers no entry names keep their dtype, as optiq leaves them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILENAME = "kv_config.json"
BITS = (0, 2, 3, 4, 5, 6, 8)  # what mx.quantize packs (0: the layer keeps its dtype)
GROUPS = (32, 64, 128)

LayerRule = tuple[int, int, int]
"""(cache index, bits, group size)."""


def _indices(entry: dict[str, Any]) -> list[int]:
    raw = entry.get("layer_idx", entry.get("layers"))
    if isinstance(raw, bool) or raw is None:
        raise ValueError("each entry needs layer_idx (a layer) or layers (a group)")
    if isinstance(raw, int):
        return [raw]
    if isinstance(raw, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                     for i in raw):
        return list(raw)
    if isinstance(raw, str):
        out: list[int] = []
        for part in raw.split(","):
            lo, _, hi = part.strip().partition("-")
            out += range(int(lo), int(hi or lo) + 1)
        return out
    raise ValueError(f"layer_idx/layers must be an index, a list or 'a-b' (got {raw!r})")


def parse_rules(raw: Any) -> tuple[LayerRule, ...]:
    """The rules of a parsed ``kv_config.json``; ValueError says what is wrong."""
    if not isinstance(raw, list):
        raise ValueError(f"must be a JSON list of layer entries (got {type(raw).__name__})")
    seen: dict[int, LayerRule] = {}
    for entry in raw:
        if not isinstance(entry, dict):
            raise ValueError(f"each entry must be an object (got {entry!r})")
        bits, group = entry.get("bits"), entry.get("group_size", 64)
        if bits not in BITS or isinstance(bits, bool):
            raise ValueError(f"bits must be one of {BITS} (got {bits!r})")
        if group not in GROUPS or isinstance(group, bool):
            raise ValueError(f"group_size must be one of {GROUPS} (got {group!r})")
        try:
            indices = _indices(entry)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None
        for i in indices:
            if i < 0 or i in seen:
                raise ValueError(f"layer {i} is negative or named twice")
            seen[i] = (i, int(bits), int(group))
    return tuple(sorted(seen.values()))


def find(spec: str, model_dir: Path | str | None) -> Path:
    """The file ``config`` (the model's own) or ``config:PATH`` names."""
    _, _, given = spec.partition(":")
    if given:
        return Path(given).expanduser()
    if model_dir is None:
        raise ValueError("--kv-quant config reads the model's kv_config.json: no model "
                         "folder here (config:PATH names a file)")
    return Path(model_dir) / FILENAME


def load(spec: str, model_dir: Path | str | None) -> tuple[Path, tuple[LayerRule, ...]]:
    """The file and its rules; ValueError names the file and the problem."""
    path = find(spec, model_dir)
    if not path.is_file():
        raise ValueError(f"--kv-quant config: {path} does not exist (the model ships no "
                         f"{FILENAME}; config:PATH names one, or use 4, 8 or turbo)")
    try:
        return path, parse_rules(json.loads(path.read_text()))
    except (ValueError, OSError) as exc:
        raise ValueError(f"--kv-quant config: {path}: {exc}") from None
