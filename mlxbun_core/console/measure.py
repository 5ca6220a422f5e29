"""What a measurement (``mlxbun bench``, ``mlxbun evals run``) runs on and is labelled
with: the engine ``serve`` runs, one stream at a time without the prefix cache, and the
version (and commit) of the code measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_engine(path: str, model_id: str, kv_quant: str) -> Any:
    """The engine ``serve`` runs, one stream at a time and without the prefix cache (a
    measurement repeats prompts; a cache hit would measure the cache)."""
    from ..engine.core import Engine
    from ..library.scan import scan
    from ..model import LoadOptions

    return Engine.load(path, LoadOptions(model_id=model_id, library=scan), progress=False,
                       batch=1, prompt_cache_bytes=0, kv_quant=kv_quant)


def commit_label() -> str:
    """mlxbun's version, and the checkout's commit when it runs from one."""
    import subprocess

    from .. import __version__

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{__version__}{'@' + rev if rev else ''}"
