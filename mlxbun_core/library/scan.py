"""The local library: every model in the Hugging Face cache and in mlxbun's own store.

One entry per repo (the revision ``refs/main`` points at, else the newest
snapshot), built from ``config.json`` and safetensors headers; no tensor bytes are
read and nothing is loaded. The claiming plugin comes from :mod:`.claim`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..models.paths import hf_cache_dir, mlxbun_home, model_id_for_dir
from . import checkpoint
from .claim import Claim, which_plugin

log = logging.getLogger("mlxbun.library")

# mlxbun's own model folders under its home, each holding <name>/config.json
OWN_ROOTS = ("converted", "models")
_HASH_SUFFIX = re.compile(r"-[0-9a-f]{12}(-(float32|float16|bfloat16|q\d))?$")


@dataclass
class Entry:
    id: str  # repo id ("owner/name") or, for our own models, the folder name
    path: Path  # a directory holding config.json
    source: str  # "hf-cache" or "mlxbun"
    size_bytes: int  # on disk
    weights: checkpoint.Weights
    config: dict = field(repr=False)
    revision: str | None = None
    modified: float = 0.0
    claim: Claim | None = None

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    @property
    def quant_bits(self) -> int | None:
        return checkpoint.quantization(self.config)[0]

    @property
    def precision(self) -> str | None:
        """How the weights are stored: ``4-bit``, ``bfloat16``, ``float32 from GGUF Q4_1``."""
        from ..models.gguf_cache import describe_precision

        source = checkpoint.read_json(self.path / "mlxbun_source.json")
        converted = describe_precision(source) if source else None
        if converted:
            return converted
        if self.quant_bits:
            return f"{self.quant_bits}-bit"
        t = self.config.get("text_config") or self.config
        dtype = t.get("torch_dtype") or t.get("dtype") or self.config.get("torch_dtype")
        return str(dtype).replace("torch.", "") if dtype else None

    @property
    def context_length(self) -> int | None:
        return checkpoint.context_window(self.config)

    @property
    def tier(self) -> str | None:
        return self.claim.tier if self.claim else None

    @property
    def vision(self) -> bool:
        return checkpoint.has_tower(self.config, self.weights, "vision")

    @property
    def audio(self) -> bool:
        return checkpoint.has_tower(self.config, self.weights, "audio")

    def row(self) -> dict:
        """The JSON shape shared by ``/library`` and ``mlxbun ls --json``."""
        return {"repo_id": self.id, "path": str(self.path), "source": self.source,
                "revision": self.revision, "model_type": self.model_type,
                "size_bytes": self.size_bytes, "weights_bytes": self.weights.total_bytes,
                "quant_bits": self.quant_bits, "precision": self.precision,
                "context_length": self.context_length,
                "vision": self.vision, "audio": self.audio, "supported": self.claim is not None,
                "support_tier": self.tier, "plugin": self.claim.plugin if self.claim else None,
                "family": self.claim.family if self.claim else None}


def _entry(path: Path, repo_id: str, source: str, size: int, revision=None, modified=0.0):
    config = checkpoint.read_json(path / "config.json")
    if not config:
        return None
    entry = Entry(repo_id, path, source, size, checkpoint.weights(path), config, revision, modified)
    try:
        entry.claim = which_plugin(path, config, repo_id)
    except Exception:  # a plugin's predicate failing must not hide the rest of the library
        log.warning("claim check failed for %s", repo_id, exc_info=True)
    return entry


def _canonical(repo):
    """The revision refs/main points at, else the most recently modified one; a
    snapshot still downloading (or left half done) is never one."""
    from .partial import incomplete

    whole = [r for r in repo.revisions if not incomplete(Path(r.snapshot_path))]
    for rev in whole:
        if "main" in rev.refs:
            return rev
    return max(whole, key=lambda r: r.last_modified, default=None)


def scan_hf_cache(cache_dir: Path | None = None) -> list[Entry]:
    import huggingface_hub as hf

    cache_dir = Path(cache_dir) if cache_dir else hf_cache_dir()
    if not cache_dir.is_dir():
        return []
    try:
        info = hf.scan_cache_dir(cache_dir)
    except Exception as exc:  # CacheNotFound, a permission problem, ...
        log.warning("could not scan the HF cache %s: %s", cache_dir, exc)
        return []
    out = []
    for repo in info.repos:
        rev = _canonical(repo) if repo.repo_type == "model" else None
        if rev is None:
            continue
        e = _entry(Path(rev.snapshot_path), repo.repo_id, "hf-cache", rev.size_on_disk,
                   rev.commit_hash, rev.last_modified)
        if e is not None:
            out.append(e)
    return out


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def scan_own(home: Path | None = None) -> list[Entry]:
    """Models mlxbun made (converted GGUFs, quantized outputs): newest per name."""
    home = mlxbun_home(home)
    newest: dict[str, Entry] = {}
    for root in OWN_ROOTS:
        for d in sorted((home / root).glob("*/")) if (home / root).is_dir() else ():
            if not (d / "config.json").is_file():
                continue
            name = _HASH_SUFFIX.sub("", model_id_for_dir(d))  # a conversion: its source's name
            modified = (d / "config.json").stat().st_mtime
            if name in newest and newest[name].modified >= modified:
                continue
            e = _entry(d, name, "mlxbun", _dir_size(d), modified=modified)
            if e is not None:
                newest[name] = e
    return list(newest.values())


def scan(cache_dir: Path | None = None, home: Path | None = None) -> list[Entry]:
    """Every local model, sorted by id (case-insensitive); HF cache ids win a name clash."""
    rows = {e.id: e for e in scan_own(home)}
    rows.update({e.id: e for e in scan_hf_cache(cache_dir)})
    return sorted(rows.values(), key=lambda e: e.id.lower())
