"""Issue #37's last rows, through real ``mlxbun`` subprocesses: ``train``'s weight decay
and rsLoRA reach the adapter (read back with mlx-lm's own loader), and the reference's
flags with nothing behind them here exit 2 with the reason, not argparse's complaint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.tuner.lora import LoRALinear
from mlx_lm.utils import load

from mlxbun_core.testing.checkpoints import tiny_checkpoint

ROWS = [{"prompt": f"Pick a fruit for day {i}", "chosen": "banana banana",
         "rejected": "cherry cherry"} for i in range(4)]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefs")
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return d


def cli(*argv, home, timeout=300):
    env = {**os.environ, "MLXBUN_HOME": str(home), "MLX_DISABLE_COMPILE": "1"}
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def lora_weights(path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(path / "adapters.safetensors")).items()}


def test_weight_decay_and_rs_lora_reach_the_adapter(ckpt, prefs, tmp_path):
    """One DPO step from LoRA's zero B: A gets no gradient, so AdamW's decay alone moves
    it, by exactly (1 - lr * weight_decay); rsLoRA's scale is alpha/sqrt(rank) in the
    adapter's config and in the LoRA layers mlx-lm's loader builds from it."""
    common = ("train", ckpt, "--data", prefs, "--method", "dpo", "--iters", 1, "--lr", 1e-4,
              "--rank", 4, "--scale", 8)
    plain, decayed = tmp_path / "plain", tmp_path / "decayed"
    run = cli(*common, "--adapter", plain, home=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    run = cli(*common, "--adapter", decayed, "--weight-decay", 1000, "--rs-lora", home=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]

    a, b = lora_weights(plain), lora_weights(decayed)
    names = [k for k in a if k.endswith("lora_a")]
    assert names
    for k in names:  # same seed, same init: only the decay tells them apart
        np.testing.assert_allclose(b[k], a[k] * (1 - 1e-4 * 1000), rtol=1e-5, atol=1e-7)
        assert np.abs(a[k]).max() > 0.01

    assert json.loads((plain / "adapter_config.json").read_text())["lora_parameters"][
        "scale"] == 8.0
    config = json.loads((decayed / "adapter_config.json").read_text())
    assert config["rs_lora"] is True and config["weight_decay"] == 1000
    assert config["lora_parameters"]["scale"] == pytest.approx(8 / 2)  # 8 / sqrt(4)
    tuned, _ = load(str(ckpt), adapter_path=str(decayed))
    scales = [float(m.scale) for _, m in tuned.named_modules() if isinstance(m, LoRALinear)]
    assert scales and scales == pytest.approx([4.0] * len(scales))


@pytest.mark.parametrize("argv, reason", [
    (("--seg", "2"), "segmented backward is not built"),
    (("--no-segment",), "no segmented backward is built"),
    (("--no-flash",), "no flash-CCE"),
    (("--no-prefix",), "no prefix sharing"),
])
def test_train_refuses_the_reference_memory_switches(ckpt, prefs, tmp_path, argv, reason):
    run = cli("train", ckpt, "--data", prefs, *argv, home=tmp_path, timeout=120)
    assert run.returncode == 2
    assert f"mlxbun: {argv[0]}: refused: " in run.stderr and reason in run.stderr, run.stderr
    assert "unrecognized" not in run.stderr and not (tmp_path / "jobs.sqlite").exists()


@pytest.mark.parametrize("argv, reason", [
    (("--rotate-weights",), "no TurboQuant weight rotation"),
    (("--rotation-seed", "7"), "no TurboQuant weight rotation"),
    (("-q", "--target-bpw", "5", "--calibration-mix", "optiq"), "--calibration-data FILE"),
])
def test_convert_refuses_rotation_and_the_optiq_mix(ckpt, tmp_path, argv, reason):
    out = tmp_path / "out"
    run = cli("convert", ckpt, "--mlx-path", out, *argv, home=tmp_path, timeout=120)
    assert run.returncode == 2 and reason in run.stderr, run.stderr
    assert "unrecognized" not in run.stderr and not out.exists()


@pytest.mark.parametrize("argv", [("segment", "--limit", "20"), ("extract", "--convs", "a,b"),
                                  ("route",), ("synthesize-stage",)])
def test_memory_stage_workers_point_at_synthesize(tmp_path, argv):
    run = cli("memory", "--root", tmp_path / "vault", *argv, home=tmp_path, timeout=120)
    assert run.returncode == 2
    assert f"memory {argv[0]}: refused" in run.stderr and "memory synthesize" in run.stderr
    assert "invalid choice" not in run.stderr and not (tmp_path / "vault").exists()
