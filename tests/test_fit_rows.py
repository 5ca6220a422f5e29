"""``mlxbun fit --skus`` and ``mlxbun fit --kv-quant config`` (a model's per-layer
``kv_config.json``), each a real ``mlxbun`` subprocess on a tiny checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxbun_core.models.facts import activation_bytes
from mlxbun_core.testing.checkpoints import tiny_checkpoint


def fit(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLXBUN_HOME": str(home), "MLXBUN_BANDWIDTH_GBS": "100",
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "fit", *args], env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


@pytest.fixture
def model(tmp_path) -> Path:
    d = tmp_path / "tiny"
    shutil.copytree(tiny_checkpoint("qwen3", seed=61, config_overrides={"head_dim": 32}), d)
    # 2 layers, 2 KV heads of 32 (a group of 32 fits a head)
    return d


def test_kv_quant_config_bills_each_layer_its_own_bits(model, tmp_path):
    missing = fit(str(model), "--kv-quant", "config", home=tmp_path / "h")
    assert missing.returncode == 2 and "kv_config.json" in missing.stderr
    (model / "kv_config.json").write_text(json.dumps(
        [{"layer_idx": 0, "bits": 4, "group_size": 32}, {"layer_idx": 1, "bits": 8,
                                                          "group_size": 32}]))
    run = fit(str(model), "--kv-quant", "config", "--json", home=tmp_path / "h")
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    a = activation_bytes(json.loads((model / "config.json").read_text()))
    per_layer = 2 * 32 * 2  # K and V of 2 heads of 32
    want = per_layer * (4 / 8 + 2 * a / 32) + per_layer * (8 / 8 + 2 * a / 32)
    assert got["kv_quant"] == "mixed (kv_config.json)"
    assert got["report"]["kv_bytes_per_token"] == pytest.approx(want)
    off = json.loads(fit(str(model), "--json", home=tmp_path / "h").stdout)
    assert off["report"]["kv_bytes_per_token"] == pytest.approx(2 * per_layer * a)
    (model / "kv_config.json").write_text(json.dumps([{"layer_idx": 7, "bits": 4}]))
    bad = fit(str(model), "--kv-quant", "config", home=tmp_path / "h")
    assert bad.returncode == 2 and "outside the model's 2 layers" in bad.stderr


def test_skus_prints_the_lineup_at_the_asked_context(model, tmp_path):
    run = fit(str(model), "--ctx", "8192", "--skus", home=tmp_path / "h")
    assert run.returncode == 0, run.stderr
    assert "Apple silicon at 8192 tokens" in run.stdout
    rows = [line for line in run.stdout.splitlines() if " GB  " in line]
    assert len(rows) >= 5 and all("fits" in r and "tok/s" in r for r in rows)
    plain = fit(str(model), "--ctx", "8192", home=tmp_path / "h")
    assert "Apple silicon" not in plain.stdout
    js = json.loads(fit(str(model), "--ctx", "8192", "--json", home=tmp_path / "h").stdout)
    assert js["sku_matrix_ctx"] == 8192 and len(js["sku_matrix"]) == len(rows)
