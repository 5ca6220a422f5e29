"""``resolve-folder``: a folder the browser picked, by name, to a servable path.

A browser's folder picker gives a name and a relative path, never where the folder
is. We look only in the caches we manage: a ``models--org--name`` hub repo (its
``refs/main`` snapshot, else the newest complete one), a snapshot commit dir, or a
model dir under ``<home>/models`` or ``<home>/converted``. Names with path
separators or ``..`` never leave those roots.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..library import checkpoint, partial
from ..models.paths import hf_cache_dir, mlxbun_home, model_id_for_dir

NOT_FOUND = "Couldn't locate this folder on disk — paste the path instead."
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[\w.@+-][\w.@+ -]{0,254}$")


def _names(body: dict[str, Any]) -> list[str]:
    """Candidate folder names: ``folder_name``, then each part of ``rel_path``."""
    out = []
    if isinstance(body.get("folder_name"), str):
        out.append(body["folder_name"].strip())
    if isinstance(body.get("rel_path"), str):
        out += [p for p in reversed(body["rel_path"].replace("\\", "/").split("/")) if p]
    return [n for n in out if _NAME.match(n) and n not in (".", "..")]


def _canonical(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir() and not partial.incomplete(snap):
            return snap
    snaps = [s for s in (repo_dir / "snapshots").glob("*") if s.is_dir()
             and not partial.incomplete(s)]
    return max(snaps, key=lambda s: s.stat().st_mtime) if snaps else None


def _find(name: str, hub: Path, home: Path) -> Path | None:
    if name.startswith(("models--", "datasets--")):
        repo = hub / name
        return _canonical(repo) if repo.is_dir() else None
    if _COMMIT.match(name):
        for snap in hub.glob(f"models--*/snapshots/{name}"):
            if snap.is_dir() and not partial.incomplete(snap):
                return snap
        return None
    for root in (home / "models", home / "converted", home / "datasets", home / "adapters",
                 home / "finetunes"):
        cand = root / name
        if cand.is_dir():
            return cand
    return None


def resolve_folder(body: dict[str, Any]) -> dict[str, Any]:
    hub, home = hf_cache_dir(), mlxbun_home()
    for name in _names(body):
        path = _find(name, hub, home)
        if path is None:
            continue
        out: dict[str, Any] = {"ok": True, "path": str(path)}
        if "snapshots" in path.parts:
            out["repo_id"] = model_id_for_dir(path)
        model_type = checkpoint.read_json(path / "config.json").get("model_type")
        if model_type:
            out["model_type"] = model_type
        return out
    return {"ok": False, "error": NOT_FOUND}
