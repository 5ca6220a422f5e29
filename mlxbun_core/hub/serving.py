"""Which model directories running servers hold, so GC from another process (``mlxbun
gc`` while a server runs) never deletes one.

Each server writes ``<home>/serving/<pid>-<n>.json`` with its model's directory when its
routes are registered and removes it on stop; a file whose process is gone is ignored
(and cleaned up by the next reader).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from ..jobs.store import pid_alive
from ..models.paths import mlxbun_home


def _dir(home: Path | None = None) -> Path:
    return mlxbun_home(home) / "serving"


_seq = itertools.count()


def announce(path: Path, home: Path | None = None) -> Path:
    """Record ``path`` as served by this process; returns the record to withdraw."""
    d = _dir(home)
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{os.getpid()}-{next(_seq)}.json"  # several servers in one process (tests)
    f.write_text(json.dumps({"pid": os.getpid(), "path": str(Path(path).resolve())}))
    return f


def withdraw(record: Path) -> None:
    record.unlink(missing_ok=True)


def served_elsewhere(home: Path | None = None) -> list[Path]:
    """Model directories live servers (this process included) announced."""
    out = []
    for f in sorted(_dir(home).glob("*.json")) if _dir(home).is_dir() else ():
        try:
            data = json.loads(f.read_text())
            pid, path = int(data["pid"]), Path(data["path"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(pid):
            out.append(path)
        else:
            f.unlink(missing_ok=True)
    return out
