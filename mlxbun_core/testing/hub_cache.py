"""A Hugging Face hub cache laid out on disk exactly as ``huggingface_hub`` writes it.

``models--owner--name/{blobs/<sha256>, refs/main, snapshots/<commit>/<file> -> blob}``:
the hub is the one boundary tests may fake, so a test cache is real files in the
real layout and every reader (``scan_cache_dir``, ``snapshot_download(local_files_only)``)
sees what it would see after a download.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def add_to_hub_cache(hub: Path, repo_id: str, checkpoint: Path, *, commit: str | None = None,
                     ref: str = "main") -> Path:
    """Copy ``checkpoint``'s files into ``hub`` as ``repo_id``; return the snapshot dir."""
    hub = Path(hub)
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    commit = commit or hashlib.sha1(f"{repo_id}:{ref}".encode()).hexdigest()
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for src in sorted(Path(checkpoint).rglob("*")):
        if not src.is_file():
            continue
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(src, blob)
        link = snap / src.relative_to(checkpoint)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snap


# Three tiny checkpoints of different families, as a user's cache might hold them.
LIBRARY_MODELS = {
    "acme/Tiny-Llama-Chat": ("llama", {"seed": 11}),
    "acme/Tiny-Gemma4-it": ("gemma4", {"seed": 12}),
    "other/Qwen3-Tiny": ("qwen3", {"seed": 13}),
}


def library_hub(hub: Path, models: dict | None = None) -> dict[str, Path]:
    """Fill ``hub`` with ``models`` (repo id -> (family, tiny_checkpoint kwargs));
    return repo id -> snapshot dir."""
    from .checkpoints import tiny_checkpoint

    models = LIBRARY_MODELS if models is None else models
    return {repo: add_to_hub_cache(hub, repo, tiny_checkpoint(family, **kw))
            for repo, (family, kw) in models.items()}


def library_env(root: Path) -> dict[str, str]:
    """Environment that points every HF and mlxbun cache at ``root`` and keeps the hub offline."""
    return {"HF_HOME": str(root / "hf"), "HF_HUB_CACHE": str(root / "hf" / "hub"),
            "HF_HUB_OFFLINE": "1", "MLXBUN_HOME": str(root / "home")}
