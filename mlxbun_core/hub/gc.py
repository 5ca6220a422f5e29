"""Disk GC: what in the caches we manage can go, and deleting exactly that.

The planner reads the HF cache and mlxbun's home (directory listings, symlinks and
small JSON files; never tensor bytes) and proposes items:

- ``revision``: a snapshot no ``refs/*`` points at (a superseded upstream push); in a
  repo with no refs at all, every snapshot but the newest. One holding a file the kept
  snapshot lacks (a file upstream removed, something added by hand) is only listed under
  ``skipped`` unless ``force``: deleting it loses that file for good;
- ``incomplete``: the links of a download that died without cleaning up (its pending
  mark's process is gone), with the ``.incomplete`` blobs of that repo;
- ``blob``: a blob no snapshot links to (left by a revision deleted by hand, or a
  stale ``.incomplete`` prefix);
- ``conversion``: a GGUF conversion under ``<home>/converted`` whose source file is gone;
- ``job-output``: what a failed or vanished job left under ``<home>`` (its output dir,
  its log and config files).

Never proposed: the served model's snapshot (or dir), nor one another running server
announced (:mod:`.serving`), a repo with a download running,
anything outside the HF cache and ``<home>``. A plan has an id (a digest of its
items); executing with that id re-plans and refuses when the cache changed since,
and deletes only items of the fresh plan, re-checked one by one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..jobs.store import pid_alive
from ..library import partial
from ..models.paths import hf_cache_dir, mlxbun_home

JOB_FILE_AGE_S = 7 * 86400  # a vanished job's files are kept a week


@dataclass(frozen=True)
class Item:
    id: str
    kind: str
    path: str
    bytes: int
    reason: str
    repo_id: str | None = None


class PlanChanged(Exception):
    """The cache changed between plan and execute."""


@dataclass
class _Repo:
    dir: Path
    repo_id: str
    refs: set[str]
    snapshots: dict[str, set[str]]  # commit -> blob names its files link to
    blobs: dict[str, int]  # blob name -> bytes
    files: dict[str, set[str]]  # commit -> its files' paths, relative to the snapshot


def _read_repo(d: Path) -> _Repo:
    refs = {f.read_text().strip() for f in (d / "refs").rglob("*") if f.is_file()} if (
        d / "refs").is_dir() else set()
    snaps: dict[str, set[str]] = {}
    files: dict[str, set[str]] = {}
    for s in sorted((d / "snapshots").iterdir()) if (d / "snapshots").is_dir() else ():
        if s.is_dir():
            links = [f for f in s.rglob("*") if f.is_symlink() or f.is_file()]
            snaps[s.name] = {os.path.basename(os.readlink(f)) for f in links if f.is_symlink()}
            files[s.name] = {str(f.relative_to(s)) for f in links}
    blobs = {b.name: b.stat().st_size for b in (d / "blobs").iterdir()
             if b.is_file()} if (d / "blobs").is_dir() else {}
    repo_id = d.name.split("--", 1)[1].replace("--", "/", 1)
    return _Repo(d, repo_id, refs, snaps, blobs, files)


def _under(path: Path, roots: Iterable[Path]) -> bool:
    try:
        real = path.resolve()
    except OSError:
        return False
    return any(real == r or real.is_relative_to(r) for r in roots)


def _served_hit(path: Path, served: list[Path]) -> bool:
    """Whether deleting ``path`` would touch a served model's directory."""
    real = path.resolve()
    return any(real == s or s.is_relative_to(real) or real.is_relative_to(s) for s in served)


def _kept(repo: _Repo, served: list[Path], dead: set[str]) -> set[str]:
    """The snapshots that stay: what a ref names (else the newest), and any served one."""
    keep = {c for c in repo.snapshots if c in repo.refs and c not in dead}
    live = [c for c in repo.snapshots if c not in dead]
    if not keep and live:  # no ref names a snapshot here: the newest is the model
        newest = max(live, key=lambda c: (repo.dir / "snapshots" / c).stat().st_mtime)
        keep.add(newest)
    keep |= {c for c in repo.snapshots if _served_hit(repo.dir / "snapshots" / c, served)}
    return keep - dead


def _repo_items(repo: _Repo, served: list[Path], busy: set[str], home: Path,
                force: bool = False) -> tuple[list[Item], list[Item]]:
    """(items to delete, superseded snapshots spared because they hold files the kept
    ones lack; with ``force`` those are items too)."""
    if repo.repo_id in busy:
        return [], []
    dead = {m["commit"] for m in partial.marks(home) if m.get("repo_dir") == str(repo.dir)}
    keep = _kept(repo, served, dead)
    kept_files = set().union(*(repo.files[c] for c in keep)) if keep else set()
    extra = {c: sorted(repo.files[c] - kept_files) for c in repo.snapshots
             if c not in keep and c not in dead and keep}
    spared = {c for c, files in extra.items() if files and not force}
    claimed = set().union(*(repo.snapshots[c] for c in keep | spared)) if keep else set()
    skipped = [Item(f"revision:{repo.repo_id}@{c}", "revision", str(repo.dir / "snapshots" / c),
                    0, _lacks(extra[c]) + "; --force prunes it", repo.repo_id)
               for c in sorted(spared)]
    items = []
    for commit in sorted(set(repo.snapshots) - keep - spared):
        own = repo.snapshots[commit] - claimed
        claimed |= own
        kind = "incomplete" if commit in dead else "revision"
        why = ("a download that stopped without finishing" if kind == "incomplete" else
               "no ref points at this snapshot (superseded)" if repo.refs & keep else
               "an older snapshot: the newest one is kept")
        if extra.get(commit):
            why += "; " + _lacks(extra[commit])
        items.append(Item(f"{kind}:{repo.repo_id}@{commit}", kind,
                          str(repo.dir / "snapshots" / commit),
                          sum(repo.blobs.get(b, 0) for b in own), why, repo.repo_id))
    for name, size in sorted(repo.blobs.items()):
        if name not in claimed:
            why = ("a partial transfer nothing is resuming" if name.endswith(".incomplete")
                   else "no snapshot links to this blob")
            items.append(Item(f"blob:{repo.repo_id}/{name}", "blob",
                              str(repo.dir / "blobs" / name), size, why, repo.repo_id))
    return items, skipped


def _lacks(extra: list[str]) -> str:
    shown = ", ".join(extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
    return f"holds files the kept revision lacks ({shown})"


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _conversion_items(home: Path, served: list[Path]) -> list[Item]:
    out = []
    root = home / "converted"
    for d in sorted(root.iterdir()) if root.is_dir() else ():
        try:
            source = json.loads((d / "mlxbun_source.json").read_text())
        except (OSError, ValueError):
            continue
        gguf = source.get("gguf") if isinstance(source, dict) else None
        if isinstance(gguf, str) and not Path(gguf).exists() and not _served_hit(d, served):
            out.append(Item(f"conversion:{d.name}", "conversion", str(d), _dir_bytes(d),
                            f"converted from {gguf}, which is gone"))
    return out


def _job_items(home: Path, served: list[Path]) -> list[Item]:
    from ..jobs.store import JobStore

    out: list[Item] = []
    db = home / "jobs.sqlite"
    rows = JobStore(db).list(500) if db.is_file() else []
    known = {r["id"] for r in rows}
    for r in rows:
        path = Path(r["output_path"]) if r["output_path"] else None
        if (r["status"] in ("failed", "zombie") and path is not None and path.exists()
                and _under(path, [home.resolve()]) and not _served_hit(path, served)):
            out.append(Item(f"job-output:{r['id']}", "job-output", str(path),
                            _dir_bytes(path) if path.is_dir() else path.stat().st_size,
                            f"output of a {r['kind']} job that {r['status']}"))
    jobs_dir = home / "jobs"
    cutoff = time.time() - JOB_FILE_AGE_S
    for f in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else ():
        if f.is_file() and f.stem not in known and f.stat().st_mtime < cutoff:
            out.append(Item(f"job-file:{f.name}", "job-output", str(f), f.stat().st_size,
                            "log or config of a job the store no longer lists"))
    return out


def plan(served: Iterable[Path] = (), *, cache: Path | None = None,
         home: Path | None = None, busy: Iterable[str] = (),
         force: bool = False) -> dict[str, Any]:
    """Everything removable, with sizes and a plan id. ``served``: model dirs in use;
    ``busy``: repo ids being downloaded; ``force``: also superseded snapshots holding files
    the kept one lacks (else listed under ``skipped``)."""
    from .serving import served_elsewhere

    cache, home = cache or hf_cache_dir(), mlxbun_home(home)
    served_paths = [Path(p).resolve() for p in [*served, *served_elsewhere(home)]]
    active = set(busy) | {m["repo_id"] for m in partial.marks(home)
                          if pid_alive(int(m.get("pid") or 0))}
    items: list[Item] = []
    skipped: list[Item] = []
    for d in sorted(cache.glob("models--*")) if cache.is_dir() else ():
        if d.is_dir():
            found, spared = _repo_items(_read_repo(d), served_paths, active, home, force)
            items += found
            skipped += spared
    items += _conversion_items(home, served_paths)
    items += _job_items(home, served_paths)
    digest = hashlib.sha256(json.dumps([[i.id, i.bytes] for i in items]).encode()).hexdigest()
    return {"ok": True, "plan_id": digest[:16], "items": [asdict(i) for i in items],
            "reclaim_bytes": sum(i.bytes for i in items), "force": force,
            "skipped": [asdict(i) for i in skipped], "superseded": _summary(items, skipped)}


def _summary(items: list[Item], skipped: list[Item]) -> list[dict[str, Any]]:
    """The per-repo summary older clients read."""
    rows: dict[str, dict[str, Any]] = {}
    for i in skipped:
        rows.setdefault(str(i.repo_id), {"repo_id": i.repo_id, "prune_snapshots": 0,
                                         "skipped_snapshots": 0, "dead_blobs": 0,
                                         "reclaim_bytes": 0})["skipped_snapshots"] += 1
    for i in items:
        if i.repo_id is None:
            continue
        r = rows.setdefault(i.repo_id, {"repo_id": i.repo_id, "prune_snapshots": 0,
                                        "skipped_snapshots": 0, "dead_blobs": 0,
                                        "reclaim_bytes": 0})
        r["prune_snapshots" if i.kind in ("revision", "incomplete") else "dead_blobs"] += 1
        r["reclaim_bytes"] += i.bytes
    return list(rows.values())


def execute(served: Iterable[Path] = (), *, plan_id: str | None = None,
            only: Iterable[str] | None = None, cache: Path | None = None,
            home: Path | None = None, busy: Iterable[str] = (),
            force: bool = False) -> dict[str, Any]:
    """Delete a fresh plan's items (``only``: just these ids). With ``plan_id``, the
    fresh plan (with the same ``force``) must be the one the caller saw, else
    :class:`PlanChanged`."""
    from .serving import served_elsewhere

    cache, home = cache or hf_cache_dir(), mlxbun_home(home)
    served = [Path(p).resolve() for p in [*served, *served_elsewhere(home)]]
    fresh = plan(served, cache=cache, home=home, busy=busy, force=force)
    if plan_id is not None and plan_id != fresh["plan_id"]:
        raise PlanChanged("the caches changed since that plan; plan again")
    wanted = set(only) if only is not None else None
    roots = [cache.resolve(), home.resolve()]
    done: list[str] = []
    counts = {"snapshots": 0, "blobs": 0, "reclaimed_bytes": 0}
    touched: set[Path] = set()
    for raw in fresh["items"]:
        item = Item(**raw)
        if wanted is not None and item.id not in wanted:
            continue
        path = Path(item.path)
        if not _under(path, roots) or _served_hit(path, served) or path.resolve() in roots:
            continue  # re-checked at the moment of deletion
        _remove(path)
        done.append(item.id)
        if item.kind in ("revision", "incomplete"):  # its blobs are counted as they go
            counts["snapshots"] += 1
            touched.add(path.parent.parent)
            partial.clear(path.parent.parent, path.name, home)
        else:
            counts["reclaimed_bytes"] += item.bytes
            counts["blobs"] += item.kind == "blob"
    for repo_dir in touched:  # blobs the deleted snapshots alone used
        _drop_unlinked_blobs(_read_repo(repo_dir), counts)
    return {"ok": True, **counts, "deleted": done}


def _drop_unlinked_blobs(repo: _Repo, counts: dict[str, int]) -> None:
    linked = set().union(*repo.snapshots.values()) if repo.snapshots else set()
    left = 0
    for name, size in repo.blobs.items():
        if name in linked or name.endswith(".incomplete"):  # a prefix: its own item
            left += 1
            continue
        (repo.dir / "blobs" / name).unlink(missing_ok=True)
        counts["reclaimed_bytes"] += size
        counts["blobs"] += 1
    if not repo.snapshots and not left:
        shutil.rmtree(repo.dir, ignore_errors=True)  # nothing of the repo is left


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path)
