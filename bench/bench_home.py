"""The mlxbun home of the servers a bench starts: a temporary one unless ``--home`` names one.

A running server writes ``<home>/serving/<pid>-<n>.json`` (and may write ``machine.json``
and other records there). Left to ``$MLXBUN_HOME`` or ``~/.cache/mlxbun``, a bench changed
the user's real home, and a pytest run beside it failed with "real mlxbun home changed".
:func:`use` points ``MLXBUN_HOME`` at the chosen home for this process and every server it
starts (in-process or a subprocess, which inherits it). The benches' shared start helpers
call it too, so a bench that never parses ``--home`` still gets a temporary home.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
from pathlib import Path

_chosen: list[Path] = []


def add_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--home", default=None,
                    help="MLXBUN_HOME for the servers this bench starts (default: a "
                         "temporary directory, removed when the bench ends)")


def use(home: str | Path | None = None) -> Path:
    """Point ``MLXBUN_HOME`` at ``home``, or (once per process, unless a home was chosen
    already) at a fresh temporary directory removed at exit; the home in use."""
    if home is not None:
        _chosen[:] = [Path(home)]
        Path(home).mkdir(parents=True, exist_ok=True)
    elif not _chosen:
        temp = tempfile.mkdtemp(prefix="mlxbun-bench-home-")
        atexit.register(shutil.rmtree, temp, ignore_errors=True)
        _chosen.append(Path(temp))
    os.environ["MLXBUN_HOME"] = str(_chosen[0])
    return _chosen[0]
