"""The wheels ``make dist`` builds, installed into a fresh virtual environment.

:func:`build_dist` runs the Makefile's own ``dist`` target (with this interpreter, no
isolated build: the test extra has setuptools). :func:`install_fresh` makes a venv with
nothing in it (``python -m venv``, no system site packages), then installs the wheels
from ``dist/`` and their dependencies from a git-ignored wheel cache of the repository
(``.wheelhouse/``), offline; the cache is filled from the index the first time (or when a
dependency changes) and reused after. pip runs from this environment against the new
one's interpreter (``pip --python``), without byte-compiling: the install takes seconds.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

WHEELHOUSE = ".wheelhouse"
DISTRIBUTIONS = ("mlxbun", "mlxbun-gemma4", "mlxbun-glm52", "mlxbun-minicpm5", "mlxbun-qwen35",
                 "mlxbun-qwen3-embed")
TIMEOUT_S = 900


def clean_env() -> dict[str, str]:
    """This environment without what points Python at the source tree."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def build_dist(root: Path, out: Path) -> list[Path]:
    """``make dist DIST=out``; the wheels it wrote."""
    subprocess.run(["make", "-s", "dist", f"DIST={out}", f"DIST_PY={sys.executable}",
                    "WHEEL_FLAGS=--no-build-isolation"], cwd=root, check=True,
                   capture_output=True, text=True, timeout=TIMEOUT_S)
    return sorted(out.glob("*.whl"))


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=clean_env())


def install_fresh(root: Path, dist: Path, venv: Path) -> None:
    """A new venv at ``venv`` with every distribution of ``dist`` installed (see the module
    docstring); RuntimeError with pip's output when it cannot be done."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=TIMEOUT_S, env=clean_env())
    cache = Path(root).resolve() / WHEELHOUSE
    cache.mkdir(exist_ok=True)
    links = ["--find-links", str(dist), "--find-links", str(cache)]
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs fill the cache once
        offline = _pip(venv, "install", "-q", "--no-compile", "--no-index", *links,
                       *DISTRIBUTIONS)
        if offline.returncode == 0:
            return
        fill = _pip(venv, "download", "-q", "--dest", str(cache), "--find-links", str(dist),
                    *DISTRIBUTIONS)
        if fill.returncode != 0:
            raise RuntimeError(f"cannot fill {cache} from the index:\n{fill.stderr[-3000:]}")
        for wheel in dist.glob("*.whl"):  # ours come from dist/, never from the cache
            (cache / wheel.name).unlink(missing_ok=True)
    done = _pip(venv, "install", "-q", "--no-compile", "--no-index", *links, *DISTRIBUTIONS)
    if done.returncode != 0:
        raise RuntimeError(f"pip install from {dist} failed:\n{done.stderr[-3000:]}")
