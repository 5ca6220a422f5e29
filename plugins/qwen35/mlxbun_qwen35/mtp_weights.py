"""Reading a checkpoint's ``mtp.*`` tensors without reading the rest of it.

``mx.load`` reads a whole safetensors file at once, and a published checkpoint keeps the
head in a shard with other tensors, so the head's tensors are read here one by one from
the file (its JSON header gives each tensor's dtype, shape and byte range). Everything
that decides whether a checkpoint has a head looks at headers only.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

PREFIX = "mtp."
_NUMPY = {"F32": "float32", "F16": "float16", "BF16": "uint16", "U32": "uint32",
          "I32": "int32", "U8": "uint8", "I8": "int8"}


def header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's tensor table and where its data starts."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        table = json.loads(f.read(size))
    table.pop("__metadata__", None)
    return table, 8 + size


def weight_files(path: Path) -> list[Path]:
    """The safetensors files holding ``mtp.*`` tensors (none: the checkpoint has no head)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return sorted({path / f for k, f in weight_map.items() if k.startswith(PREFIX)})
    return [f for f in sorted(path.glob("*.safetensors"))
            if any(k.startswith(PREFIX) for k in header(f)[0])]


def tensor_bytes(table: dict[str, Any]) -> int:
    """The bytes of a tensor table's entries (their byte ranges in the file)."""
    return sum(int(e["data_offsets"][1]) - int(e["data_offsets"][0]) for e in table.values())


def read(files: list[Path]) -> dict[str, Any]:
    """Every ``mtp.*`` tensor of ``files`` as an MLX array (only those bytes are read)."""
    import mlx.core as mx
    import numpy as np

    out: dict[str, Any] = {}
    for path in files:
        table, start = header(path)
        with path.open("rb") as f:
            for name, entry in table.items():
                if not name.startswith(PREFIX):
                    continue
                begin, end = entry["data_offsets"]
                f.seek(start + begin)
                raw = np.frombuffer(f.read(end - begin), dtype=_NUMPY[entry["dtype"]])
                array = mx.array(raw.reshape(entry["shape"]))
                out[name] = array.view(mx.bfloat16) if entry["dtype"] == "BF16" else array
    return out


def raw_hf(path: Path) -> bool:
    """Whether the checkpoint is HF's own layout (its conv1d kernels not yet transposed by
    mlx-lm), whose zero-centred norms need the ``+1``."""
    for f in sorted(path.glob("*.safetensors")):
        for name, entry in header(f)[0].items():
            if "conv1d.weight" in name:
                return bool(entry["shape"][-1] != 1)
    return True


def sanitize(weights: dict[str, Any], hf: bool) -> dict[str, Any]:
    """``mtp.X`` -> ``X``; HF's zero-centred RMSNorm weights get their ``+1`` (as mlx-lm's
    sanitize does for the target) when ``hf``; MoE experts, fused (``experts.gate_up_proj``)
    or one by one (``experts.N.gate_proj.weight``), become mlx-lm's stacked ``switch_mlp``."""
    import mlx.core as mx

    out = {}
    for k, v in weights.items():
        name = k[len(PREFIX):]
        if hf and v.ndim == 1 and name.endswith("norm.weight"):
            v = v + 1.0
        out[name] = v
    for key in [k for k in out if k.endswith(".experts.gate_up_proj")]:
        base = key.removesuffix(".experts.gate_up_proj")
        gate_up = out.pop(key)
        mid = gate_up.shape[-2] // 2
        out[f"{base}.switch_mlp.gate_proj.weight"] = gate_up[..., :mid, :]
        out[f"{base}.switch_mlp.up_proj.weight"] = gate_up[..., mid:, :]
        out[f"{base}.switch_mlp.down_proj.weight"] = out.pop(f"{base}.experts.down_proj")
    for key in [k for k in out if k.endswith(".experts.0.gate_proj.weight")]:
        base = key.removesuffix(".experts.0.gate_proj.weight")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names = sorted((k for k in out if k.startswith(f"{base}.experts.")
                            and k.endswith(f".{proj}.weight")),
                           key=lambda k: int(k.split(".experts.")[1].split(".")[0]))
            out[f"{base}.switch_mlp.{proj}.weight"] = mx.stack([out.pop(k) for k in names])
    return out
