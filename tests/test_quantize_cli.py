"""`mlxbun quantize` on a converted GGUF: the output is named after the model, a query
for the model still finds it afterwards, and the progress shows real stages."""

from __future__ import annotations

import os
import subprocess
import sys

from mlxbun_core.jobs.store import JobStore
from mlxbun_core.library.scan import scan_own
from mlxbun_core.models.resolve import resolve_model
from test_gguf import write_tiny_gguf


def test_quantize_a_conversion_then_query_it(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MLXBUN_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    g = tmp_path / "Tiny-Chat.Q8_0.gguf"
    write_tiny_gguf(g)
    converted = resolve_model(str(g), progress=False).path
    run = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "quantize", "Tiny-Chat",
                          "--bits", "4", "--group-size", "32"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "MLX_DISABLE_COMPILE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    out = home / "models" / "Tiny-Chat.Q8_0-4bit-g32"  # not "<stem>-<hash>-float32-4bit-g32"
    assert (out / "config.json").is_file(), sorted(p.name for p in (home / "models").iterdir())
    assert {e.id for e in scan_own(home)} == {"Tiny-Chat.Q8_0", "Tiny-Chat.Q8_0-4bit-g32"}

    # the query that named the model before the quantize still does: the unquantized one
    assert resolve_model("Tiny-Chat", progress=False).path == converted
    assert resolve_model("4bit", progress=False).path == out

    # the bar shows stages and their share of the work, not a rate in %/s
    assert "%/s" not in run.stderr
    job = JobStore(home / "jobs.sqlite").list()[0]
    stages = [e for _, e in JobStore(home / "jobs.sqlite").events(job["id"])
              if e.get("type") == "stage"]
    assert [s["stage"] for s in stages][0] == "load" and stages[-1]["stage"] == "save"
    quantizing = [s["progress"] for s in stages if s["stage"] == "quantize"]
    assert len(quantizing) >= 5 and quantizing == sorted(quantizing)
    assert all("tensors" in s["message"] for s in stages if s["stage"] == "quantize")
