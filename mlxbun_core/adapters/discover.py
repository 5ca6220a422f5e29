"""Where adapters live on disk, and what is there (configs only, no tensors)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import APIError
from ..models.paths import mlxbun_home
from . import formats

log = logging.getLogger("mlxbun.adapters")


def adapters_dir(home: Path | None = None) -> Path:
    """Adapters the user put there, merges, and HTTP fine-tunes by default."""
    return mlxbun_home(home) / "adapters"


def finetunes_dir(home: Path | None = None) -> Path:
    """`mlxbun train` outputs by default."""
    return mlxbun_home(home) / "finetunes"


def scan(home: Path | None = None) -> list:
    """Every adapter directory one level under our two roots, as AdapterInfo, newest first."""
    found = []
    for root in (adapters_dir(home), finetunes_dir(home)):
        if not root.is_dir():
            continue
        for d in root.iterdir():
            if not d.is_dir() or not formats.is_adapter_dir(d):
                continue
            try:
                found.append(formats.read_info(d.resolve()))
            except APIError as exc:  # one unreadable adapter never hides the rest
                log.warning("skipping adapter %s: %s", d, exc.message)
    return sorted(found, key=lambda i: -i.weights_file.stat().st_mtime)
