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


KV_CONFIG = [{"layer_idx": 0, "bits": 8}, {"layers": "1-1", "bits": 4}]
OLD_SCHEMA = ("CREATE TABLE runs (id INTEGER PRIMARY KEY, at REAL, stack TEXT, model TEXT, "
              "bench TEXT, kv TEXT, prompt_tokens INTEGER, decode_tokens INTEGER, runs INTEGER, "
              "prefill_tps REAL, decode_tps REAL, ttft_ms REAL, peak_bytes INTEGER, "
              "\"commit\" TEXT)")


def test_bench_kv_schemes_show_in_measured_bytes_per_token(tmp_path):
    """Each --kv-quant scheme's measured KV bytes per token equals what its bits cost on
    this shape (2 layers, 2 KV heads of 64, bfloat16): the scheme was applied."""
    import sqlite3

    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(home / "evals.sqlite") as db:  # a DB from before the new columns
        db.execute(OLD_SCHEMA)
    env = {**os.environ, "MLXBUN_HOME": str(home), "HF_HUB_OFFLINE": "1"}

    def mlxbun(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *args], env=env,
                              capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)

    model = str(tiny_checkpoint("llama", seed=75, config_overrides={"head_dim": 64},
                                extra_files={"kv_config.json": KV_CONFIG}))
    elements = 2 * 64 * 2  # KV heads × head dim × (keys, values), per layer and token

    def quantized(key_bits: int, value_bits: int) -> float:  # groups of 64, bf16 scale+bias
        return elements * ((key_bits + value_bits) / 16 + 2 * 2 / 64)

    want = {"off": 2 * elements * 2, "8": 2 * quantized(8, 8), "4": 2 * quantized(4, 4),
            "config": quantized(8, 8) + quantized(4, 4), "turbo": 2 * quantized(8, 3),
            "turbo:k4v4": 2 * quantized(4, 4)}
    for scheme, per_token in want.items():
        run = mlxbun("bench", model, "--kv-quant", scheme, "--tokens", "3", "--runs", "1",
                     "--prompt-tokens", "64", "--json")
        assert run.returncode == 0, run.stderr[-2000:]
        row = json.loads(run.stdout)
        assert row["kv"] == scheme and row["kv_bytes_per_token"] == per_token, (scheme, row)
    off = mlxbun("bench", model, "--compiled-activations", "off", "--tokens", "3", "--runs",
                 "1", "--prompt-tokens", "64", "--json")
    assert off.returncode == 0 and "compile off" in json.loads(off.stdout)["switches"]
    for flag in ("--fused-sdpa", "--compiled-decode"):
        refused = mlxbun("bench", model, flag, "on")
        assert refused.returncode == 2 and f"{flag} is refused" in refused.stderr
    raw = [json.loads(line) for line in mlxbun("evals", "--raw").stdout.splitlines()]
    assert [r["kv"] for r in raw] == ["off", *reversed(want)]
    assert "1024 B" in mlxbun("evals").stdout
