"""Which snapshots in the HF cache are half there, so the library never lists them.

A download marks its snapshot ``pending`` (a small file under ``<home>/downloads/pending``)
before the first byte and clears the mark only once every file is in place; a job that
fails or is cancelled removes the snapshot's links itself, and one killed outright leaves
the mark, so the snapshot stays hidden until a download completes it or GC removes it.
Downloads by other tools are judged by ``huggingface_hub``'s own tree listing
(``trees/<commit>.json``): a listed weight or config file that is missing means partial.
This module reads files only; it is imported by the library scan.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..models.paths import mlxbun_home

ESSENTIAL = (".safetensors", "config.json")


def pending_dir(home: Path | None = None) -> Path:
    return mlxbun_home(home) / "downloads" / "pending"


def _mark(repo_dir: Path, commit: str, home: Path | None = None) -> Path:
    return pending_dir(home) / f"{repo_dir.name}@{commit}.json"


def mark(repo_dir: Path, commit: str, repo_id: str, home: Path | None = None) -> None:
    path = _mark(repo_dir, commit, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"repo_id": repo_id, "commit": commit, "pid": os.getpid(),
                                "started": time.time(), "repo_dir": str(repo_dir)}))


def clear(repo_dir: Path, commit: str, home: Path | None = None) -> None:
    _mark(repo_dir, commit, home).unlink(missing_ok=True)


def marks(home: Path | None = None) -> list[dict]:
    """Every pending mark: ``{repo_id, commit, pid, started, repo_dir, path}``."""
    out = []
    for f in sorted(pending_dir(home).glob("*.json")) if pending_dir(home).is_dir() else ():
        try:
            out.append({**json.loads(f.read_text()), "path": str(f)})
        except (OSError, ValueError):
            continue
    return out


def incomplete(snapshot: Path, home: Path | None = None) -> bool:
    """Whether the snapshot dir ``.../models--o--n/snapshots/<commit>`` is partial."""
    repo_dir, commit = snapshot.parent.parent, snapshot.name
    if _mark(repo_dir, commit, home).exists():
        return True
    tree = repo_dir / "trees" / f"{commit}.json"
    try:
        files = json.loads(tree.read_text()).get("files") or {}
    except (OSError, ValueError, AttributeError):
        return False  # no listing: nothing says it is partial
    return any(name.endswith(ESSENTIAL) and not (snapshot / name).exists() for name in files)
