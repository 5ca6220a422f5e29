"""Facts about a checkpoint directory read from its small files only.

Safetensors files start with an 8-byte length and a JSON header naming every
tensor's dtype, shape and byte range; summing those ranges gives the exact weight
bytes without reading a single tensor.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..models.facts import text_config

MAX_HEADER_BYTES = 64 << 20  # a header bigger than this is not a safetensors file we trust
_EXPERT = re.compile(r"(?<!shared_)experts?\.|switch_mlp\.")


def context_window(config: dict) -> int | None:
    """The trained context length the config states, or None."""
    for c in (text_config(config), config):
        v = c.get("max_position_embeddings")
        if isinstance(v, int) and v > 0:
            return v
    return None


def read_json(path: Path) -> dict:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def safetensors_header(path: Path) -> dict:
    """The JSON header of one ``.safetensors`` file ({} if unreadable)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                return {}
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return {}
    return header if isinstance(header, dict) else {}


@dataclass
class Weights:
    total_bytes: int = 0
    expert_bytes: int = 0  # routed-expert tensors (MoE); only a share is read per token
    dtypes: dict = field(default_factory=dict)  # dtype -> bytes
    names: list = field(default_factory=list)  # tensor names (for capability checks)


def weights(directory: Path) -> Weights:
    """Tensor bytes of every ``*.safetensors`` in ``directory``, from headers alone."""
    out = Weights()
    for f in sorted(Path(directory).glob("*.safetensors")):
        for name, info in safetensors_header(f).items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            start, end = (info.get("data_offsets") or (0, 0))[:2]
            n = max(0, int(end) - int(start))
            out.total_bytes += n
            out.dtypes[info.get("dtype", "?")] = out.dtypes.get(info.get("dtype", "?"), 0) + n
            out.names.append(name)
            if _EXPERT.search(name):
                out.expert_bytes += n
    return out


def active_weight_bytes(config: dict, w: Weights) -> int:
    """Bytes one decode step reads: dense weights plus the routed experts' active share."""
    t = text_config(config)
    experts = (t.get("num_experts") or t.get("n_routed_experts") or t.get("num_local_experts")
               or 0)
    active = t.get("num_experts_per_tok") or t.get("top_k_experts") or 0
    if not (w.expert_bytes and experts and active):
        return w.total_bytes
    return int(w.total_bytes - w.expert_bytes + w.expert_bytes * active / experts)


def quantization(config: dict) -> tuple[int | None, int | None]:
    """(bits, group_size) of an MLX- or HF-quantized checkpoint, else (None, None)."""
    q = config.get("quantization") or config.get("quantization_config") or {}
    if not isinstance(q, dict):
        return None, None
    bits = q.get("bits")
    return (int(bits) if isinstance(bits, int) else None,
            q.get("group_size") if isinstance(q.get("group_size"), int) else None)


def has_tower(config: dict, w: Weights, kind: str) -> bool:
    """A ``{kind}_config`` plus tensors for it: the checkpoint can take that input."""
    if not isinstance(config.get(f"{kind}_config"), dict):
        return False
    marks = {"vision": ("vision", "visual", "image", "patch_embed"),
             "audio": ("audio",)}[kind]
    return any(m in name for name in w.names for m in marks)
