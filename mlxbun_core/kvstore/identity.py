"""What must match before stored KV may be reused: the serving fingerprint.

The fingerprint names this server's directory under ``--ssd-cache``. It covers
everything that changes the numbers and is fixed for the process: the model's
config and weight files, the tokenizer and chat-template files, the cache format,
the MLX and mlx-lm versions and the device. Per-request identity (adapters, KV
scheme, media) lives in the namespace key inside that directory. Weight files
are identified by name, size and modification time (hashing gigabytes at every
start would cost more than it saves); config and tokenizer files by content.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Iterable
from pathlib import Path

import xxhash

from .fileformat import VERSION

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.json",
                   "chat_template.jinja", "generation_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz", ".bin")


def device_identity() -> dict:
    """MLX version, device kind and architecture: a change selects a fresh directory."""
    import mlx.core as mx

    info: dict = {"mlx": mx.__version__,  # type: ignore[attr-defined]  # not in MLX's stubs
                  "device": str(mx.default_device())}
    try:
        import mlx_lm

        info["mlx_lm"] = getattr(mlx_lm, "__version__", "")
    except ImportError:  # pragma: no cover - mlx-lm is a dependency
        pass
    try:
        d = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        info["arch"] = f"{d.get('architecture', '')} {d.get('device_name', '')}".strip()
    except Exception:  # an older MLX without device_info: the version still counts
        info["arch"] = platform.machine()
    return info


def _files(path: Path, names: Iterable[str]) -> list:
    out = []
    for name in names:
        p = path / name
        if p.is_file():
            out.append([name, xxhash.xxh3_128_hexdigest(p.read_bytes())])
    return out


def _weights(path: Path) -> list:
    rows = []
    for p in sorted(path.iterdir()) if path.is_dir() else [path]:
        if p.suffix in WEIGHT_SUFFIXES and p.is_file():
            st = p.stat()
            rows.append([p.name, st.st_size, st.st_mtime_ns])
    return rows


def serving_fingerprint(model_path: Path, extra: dict | None = None) -> str:
    """A 32-hex-digit digest naming this server's entries (see the module docstring)."""
    model_path = Path(model_path)
    parts = {
        "format": VERSION,
        "path": str(model_path.resolve()) if model_path.exists() else str(model_path),
        "config": _files(model_path, ("config.json",)) if model_path.is_dir() else [],
        "weights": _weights(model_path) if model_path.exists() else [],
        "tokenizer": _files(model_path, TOKENIZER_FILES) if model_path.is_dir() else [],
        "device": device_identity(),
        "extra": extra or {},
    }
    return xxhash.xxh3_128_hexdigest(json.dumps(parts, sort_keys=True, default=str).encode())


def namespace_key(fingerprint: str, parts: list) -> str:
    """The directory name of one namespace (JSON-able ``parts``, in order)."""
    return xxhash.xxh3_128_hexdigest(json.dumps([fingerprint, parts], default=str).encode())


def file_identity(path: Path) -> list:
    """Name, size and mtime of every weight file under ``path`` (adapters)."""
    path = Path(path)
    try:
        return _weights(path) if path.is_dir() else [[path.name, path.stat().st_size,
                                                      path.stat().st_mtime_ns]]
    except OSError:
        return []
