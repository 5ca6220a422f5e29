"""What `mlxbun serve` imports before it serves: a torch that shares the environment stays
out (transformers imported it for its own models: seconds of every start and engine child)
unless xgrammar, which imports it, is the grammar backend."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from mlxbun_core.torchless import keep_torch_out
hidden = keep_torch_out({backend!r})
if hidden:
    from mlxbun_core.engine.core import Engine
import transformers
print("hidden", hidden, "torch", sys.modules.get("torch") is not None,
      "transformers-sees-torch", transformers.utils.is_torch_available())
"""


def probe(backend: str | None, **env: str) -> str:
    import os

    r = subprocess.run([sys.executable, "-c", PROBE.format(backend=backend)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_serve_keeps_torch_out_of_the_engine_imports():
    assert probe(None) == "hidden True torch False transformers-sees-torch False"


def test_xgrammar_or_mlxbun_torch_keeps_it():
    seen = "hidden False torch False transformers-sees-torch True"
    assert probe("xgrammar") == seen
    assert probe(None, MLXBUN_TORCH="1") == seen
