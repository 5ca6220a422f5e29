"""Where a GGUF's MLX conversion lives: keyed by the file's content and the stored precision.

The same GGUF reached from two environments (``make serve``'s venv, a pip venv) or two
copies is converted once: the key is the SHA-256 of its bytes, not its path. Hashing
costs about a second per 100 MB, so the digest is remembered by (path, size, mtime) in
``<home>/gguf-digests.json`` and a restart only stats the file.

The stored precision follows the backend: float32 on a CPU (with an optimized BLAS the
fast path there; MLX's CPU quantized kernels are slower), and on Metal or CUDA the
source's own bit width as MLX quantized weights (4-bit for Q4_*, 8-bit for Q8_0, ...).
``MLXBUN_CONVERT_PRECISION`` (``float32``, ``float16``, ``bfloat16``, ``q4``, ``q8``, ...)
overrides the choice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..runconfig import current

log = logging.getLogger("mlxbun.models")

DIGESTS_FILE = "gguf-digests.json"
MAX_REMEMBERED = 256  # digests kept in the index (newest first)
GGUF_MAGIC = b"GGUF"
FLOAT_PRECISIONS = ("float32", "float16", "bfloat16")
QUANT_BITS = (2, 3, 4, 5, 6, 8)


class NotGGUF(ValueError):
    """The file does not start with the GGUF magic bytes."""


def check_magic(path: Path) -> None:
    """Raise :class:`NotGGUF` unless ``path`` starts like a GGUF file."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        shown = head.decode("latin-1").encode("unicode_escape").decode() or "an empty file"
        raise NotGGUF(f"{path} is not a GGUF file (it starts with {shown!r}, not 'GGUF')")


@dataclass(frozen=True)
class Fingerprint:
    digest: str  # SHA-256 of the file's bytes
    ggml_type: str  # the type most weight tensors are stored in (Q4_1, Q8_0, F16, ...)


def fingerprint(path: Path, home: Path) -> Fingerprint:
    """``path``'s content digest and dominant tensor type, computed once per (path, size,
    mtime); a file that is not a GGUF raises :class:`NotGGUF` before any hashing."""
    path = path.resolve()
    check_magic(path)
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    index_path = home / DIGESTS_FILE
    try:
        index = json.loads(index_path.read_text())
        index = index if isinstance(index, dict) else {}
    except (OSError, ValueError):
        index = {}
    hit = index.get(key)
    if isinstance(hit, dict) and isinstance(hit.get("sha256"), str) and hit.get("type"):
        return Fingerprint(hit["sha256"], hit["type"])
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest() if hasattr(hashlib, "file_digest") \
            else _sha256(f)
    found = Fingerprint(digest, dominant_type(gguf_tensor_types(path)))
    index = {key: {"sha256": found.digest, "type": found.ggml_type},
             **{k: v for k, v in index.items() if k != key}}
    index = dict(list(index.items())[:MAX_REMEMBERED])
    try:
        home.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=0))
        os.replace(tmp, index_path)
    except OSError as exc:  # a read-only home still converts; it just hashes again next time
        log.debug("could not remember the digest of %s: %s", path, exc)
    return found


def _sha256(f) -> str:  # Python 3.10
    h = hashlib.sha256()
    while chunk := f.read(1 << 22):
        h.update(chunk)
    return h.hexdigest()


def dominant_type(tensor_types) -> str:
    """The GGML type most weight matrices are stored in (``Q4_1``, ``Q8_0``, ``F16``, ...)."""
    counts = Counter(tensor_types)
    return counts.most_common(1)[0][0] if counts else "F32"


def source_bits(ggml_type: str) -> int | None:
    """MLX bits that keep a quantized GGML type's precision (None for float types)."""
    m = re.match(r"I?Q(\d)", ggml_type.upper())
    if not m:
        return None
    bits = int(m.group(1))
    return 4 if bits < 4 else bits if bits in QUANT_BITS else 8


def stored_precision(ggml_type: str, gpu: bool) -> str:
    """``float32`` on a CPU; on a GPU ``q<bits>`` for a quantized source, else float16."""
    env = current().models.convert_precision
    if env and env != "auto":
        if env in FLOAT_PRECISIONS or (env[:1] == "q" and env[1:].isdigit()
                                       and int(env[1:]) in QUANT_BITS):
            return env
        log.warning("MLXBUN_CONVERT_PRECISION=%r is not float32/float16/bfloat16/q2-q8; "
                    "ignored", env)
    if not gpu:
        return "float32"
    bits = source_bits(ggml_type)
    return f"q{bits}" if bits else ("bfloat16" if ggml_type == "BF16" else "float16")


def describe_precision(source: dict) -> str | None:
    """``float32 from GGUF Q4_1`` for a conversion's ``mlxbun_source.json``."""
    precision = source.get("precision") or source.get("dtype")
    if not precision:
        return None
    shown = f"{precision[1:]}-bit" if precision.startswith("q") else precision
    return f"{shown} from GGUF {source['source_type']}" if source.get("source_type") else shown


def conversion_dir(home: Path, gguf: Path, digest: str, precision: str) -> Path:
    return home / "converted" / f"{gguf.stem}-{digest[:12]}-{precision}"


def backend_is_gpu() -> bool:
    import mlx.core as mx

    return mx.default_device() == mx.gpu


def gguf_tensor_types(path: Path) -> list[str]:
    """The GGML type name of every matrix (norms and biases left out; header only)."""
    import gguf

    return [t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors
            if len(t.shape) >= 2]
