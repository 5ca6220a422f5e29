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
