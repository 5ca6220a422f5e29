"""LoRA adapter directories on disk: mlx-lm's format and PEFT's.

- mlx-lm: ``adapter_config.json`` (``lora_parameters.{rank,scale}``, ``model``,
  ``fine_tune_type``) + ``adapters.safetensors`` with ``<module>.lora_a`` shaped
  ``(in, r)`` and ``<module>.lora_b`` shaped ``(r, out)``.
- PEFT (what the hub mostly carries): ``adapter_config.json`` (``r``,
  ``lora_alpha``, ``use_rslora``, ``base_model_name_or_path``) +
  ``adapter_model.safetensors`` with ``base_model.model.<module>.lora_A.weight``
  shaped ``(r, in)`` and ``lora_B.weight`` shaped ``(out, r)``.

Both become one in-memory shape: ``{module path: (a (in, r), b (r, out), scale)}``,
exactly what mlx-lm's ``LoRALinear`` multiplies. Reading a config is cheap (listings);
reading tensors happens on the worker thread when mounting.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ..errors import BadRequest

MLX_WEIGHTS = "adapters.safetensors"
PEFT_WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


@dataclass
class AdapterInfo:
    """What an adapter directory says about itself (no tensors read)."""

    path: Path
    format: str  # "mlx" or "peft"
    rank: int | None
    scale: float
    base_model: str | None
    config: dict

    @property
    def weights_file(self) -> Path:
        return self.path / (MLX_WEIGHTS if self.format == "mlx" else PEFT_WEIGHTS)

    @property
    def size_bytes(self) -> int:
        try:
            return self.weights_file.stat().st_size
        except OSError:
            return 0

    def row(self) -> dict:
        return {"path": str(self.path), "format": self.format, "rank": self.rank,
                "scale": self.scale, "base_model": self.base_model,
                "size_bytes": self.size_bytes}


def is_adapter_dir(path: Path) -> bool:
    return (path / CONFIG).is_file() and ((path / MLX_WEIGHTS).is_file()
                                         or (path / PEFT_WEIGHTS).is_file())


def read_info(path: Path) -> AdapterInfo:
    """Parse ``adapter_config.json``; a 400 naming the problem when it is not an adapter
    mlxbun can serve."""
    try:
        config = json.loads((path / CONFIG).read_text())
    except FileNotFoundError:
        raise BadRequest(f"{path} has no {CONFIG}", param="path") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"{path / CONFIG} is not valid JSON: {exc}", param="path") from None
    if not isinstance(config, dict):
        raise BadRequest(f"{path / CONFIG} must hold a JSON object", param="path")
    if (path / MLX_WEIGHTS).is_file():
        return _mlx_info(path, config)
    if (path / PEFT_WEIGHTS).is_file():
        return _peft_info(path, config)
    raise BadRequest(f"{path} has neither {MLX_WEIGHTS} (mlx-lm) nor {PEFT_WEIGHTS} (PEFT)",
                     param="path")


def _number(value, what: str, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{path / CONFIG}: {what} must be a number", param="path")
    return float(value)


def _mlx_info(path: Path, config: dict) -> AdapterInfo:
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise BadRequest(f"{path}: fine_tune_type {kind!r} cannot be hot-swapped (LoRA only; "
                         "fuse it into the base with mlx_lm.fuse instead)", param="path")
    params = config.get("lora_parameters")
    if not isinstance(params, dict) or "scale" not in params:
        raise BadRequest(f"{path / CONFIG}: lora_parameters.scale is missing", param="path")
    rank = params.get("rank")
    return AdapterInfo(path, "mlx", int(rank) if isinstance(rank, int) else None,
                       _number(params["scale"], "lora_parameters.scale", path),
                       _base(config.get("model")), config)


def _peft_info(path: Path, config: dict) -> AdapterInfo:
    kind = str(config.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise BadRequest(f"{path}: PEFT type {kind} is not supported (LoRA only)", param="path")
    for flag, why in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D) layers")):
        if config.get(flag):
            raise BadRequest(f"{path}: {why} adapters are not supported", param="path")
    if config.get("modules_to_save"):
        raise BadRequest(f"{path}: modules_to_save (full weights) cannot be hot-swapped",
                         param="path")
    if config.get("bias", "none") not in ("none", None):
        raise BadRequest(f"{path}: LoRA bias training ({config['bias']!r}) is not supported",
                         param="path")
    r = config.get("r")
    rank = int(_number(r, "r", path)) if r is not None else None
    alpha = _number(config.get("lora_alpha", rank or 8), "lora_alpha", path)
    return AdapterInfo(path, "peft", rank, _peft_scale(alpha, rank or 1, config),
                       _base(config.get("base_model_name_or_path")), config)


def _peft_scale(alpha: float, rank: int, config: dict) -> float:
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _base(value) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def bare_name(name: str) -> str:
    """``org/Model-Name`` or ``/some/dir/Model-Name`` → ``model-name``."""
    return name.rstrip("/").rsplit("/", 1)[-1].lower()


# -- tensors (worker thread) --------------------------------------------------------

_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.default)?\.weight$")


def load_tensors(info: AdapterInfo) -> dict:
    """``{module path: (a, b, scale)}`` from the weights file; a 400 for stray tensors."""
    import mlx.core as mx

    try:
        raw = cast("dict[str, mx.array]", mx.load(str(info.weights_file)))
    except Exception as exc:
        raise BadRequest(f"{info.weights_file} cannot be read: {exc}", param="path") from None
    if info.format == "mlx":
        return _pair(raw, lambda k: k.rsplit(".", 1) if k.endswith((".lora_a", ".lora_b"))
                     else None, "lora_a", "lora_b", info, transpose=False)
    return _pair(raw, _peft_split, "A", "B", info, transpose=True)


def _peft_split(key: str):
    m = _PEFT_KEY.match(key)
    return (m.group(1), m.group(2)) if m else None


def _pair(raw: dict, split, a_name: str, b_name: str, info: AdapterInfo, *, transpose: bool):
    parts: dict = {}
    stray = []
    for key, value in raw.items():
        got = split(key)
        if got is None:
            stray.append(key)
            continue
        module, which = got
        parts.setdefault(module, {})[which] = value
    if stray:
        raise BadRequest(f"{info.weights_file.name} holds tensors that are not LoRA factors: "
                         + ", ".join(sorted(stray)[:5]), param="path")
    out = {}
    for module, ab in parts.items():
        if set(ab) != {a_name, b_name}:
            raise BadRequest(f"{info.weights_file.name}: {module} lacks one of its LoRA factors",
                             param="path")
        a, b = ab[a_name], ab[b_name]
        if transpose:  # PEFT stores nn.Linear weights: A (r, in), B (out, r)
            a, b = a.T, b.T
        out[module] = (a, b, _module_scale(module, info))
    if not out:
        raise BadRequest(f"{info.weights_file.name} holds no LoRA tensors", param="path")
    return out


def _module_scale(module: str, info: AdapterInfo) -> float:
    """PEFT's ``alpha_pattern`` / ``rank_pattern`` override the scale per module name."""
    if info.format != "peft":
        return info.scale
    cfg = info.config
    rank = _pattern(cfg.get("rank_pattern"), module) or info.rank or 1
    alpha = _pattern(cfg.get("alpha_pattern"), module) or cfg.get("lora_alpha", rank)
    return _peft_scale(float(alpha), int(rank), cfg)


def _pattern(patterns, module: str):
    if not isinstance(patterns, dict):
        return None
    for key, value in patterns.items():
        if module == key or module.endswith("." + key):
            return value
        try:
            if re.fullmatch(key, module):
                return value
        except re.error:
            continue
    return None
