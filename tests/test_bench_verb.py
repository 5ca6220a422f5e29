"""``mlxbun bench`` and ``mlxbun evals``: a real ``mlxbun`` subprocess runs the engine on a
tiny checkpoint and records the median; ``evals`` lists, prints and archives the DB."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mlxbun_core.testing.checkpoints import tiny_checkpoint


def test_bench_records_a_run_that_evals_lists_then_clears(tmp_path):
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}

    def mlxbun(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *args], env=env,
                              capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)

    model = str(tiny_checkpoint("qwen3", seed=71))
    assert "no evals yet" in mlxbun("evals").stdout
    run = mlxbun("bench", model, "--tokens", "8", "--runs", "2", "--prompt-tokens", "64",
                 "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    row = json.loads(run.stdout)
    assert 64 <= row["prompt_tokens"] < 100 and 1 <= row["decode_tokens"] <= 8
    assert row["prefill_tps"] > 0 and row["ttft_ms"] > 0 and row["peak_bytes"] > 0
    assert row["decode_tps"] > 0 or row["decode_tokens"] == 1
    assert row["runs"] == 2 and row["kv"] == "off" and row["stack"] == "mlxbun"
    raw = [json.loads(line) for line in mlxbun("evals", "--raw").stdout.splitlines()]
    assert raw == [row]
    table = mlxbun("evals").stdout
    assert row["model"][-20:] in table and "decode" in table and "TTFT" in table
    bad = mlxbun("bench", model, "--runs", "0")
    assert bad.returncode == 2 and "at least 1" in bad.stderr
    cleared = mlxbun("evals", "--clear")
    assert "archived to" in cleared.stdout
    assert list((tmp_path / "home").glob("evals-*.sqlite"))
    assert mlxbun("evals", "--raw").stdout == ""
