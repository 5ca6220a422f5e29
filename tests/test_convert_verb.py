"""``mlxbun convert``: mlx_lm.convert's flags through mlx-lm's public ``convert`` (uniform
bits, group size, dtype), mixed bits to a target size (data-free and calibrated), the
refusals said before any work, the push to a (fake) hub, and the GGUF import; each a real
``mlxbun`` subprocess on a tiny checkpoint, the outputs loaded by mlx-lm and served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.fake_hub import FakeHub, hub_environment

TOKEN = "hf_testtoken_convert_0123"


def mlxbun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *map(str, args)],
                          env=env or os.environ.copy(), capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def src() -> Path:
    return tiny_checkpoint("qwen3", seed=51)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def bpw(path: Path) -> float:
    from mlx_lm import load
    from mlx_lm.utils import compute_bits_per_weight

    model = load(str(path))[0]
    return float(compute_bits_per_weight(model))


def generates(path: Path) -> None:
    run = mlxbun("generate", path, "--raw", "--prompt", "hello", "--max-tokens", "4", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["usage"]["completion_tokens"] > 0


def test_uniform_bits_group_and_dtype_as_mlx_lm_convert(src, tmp_path):
    out = tmp_path / "q8"
    run = mlxbun("convert", "--hf-path", src, "--mlx-path", out, "-q", "--q-bits", "8",
                 "--q-group-size", "32")
    assert run.returncode == 0, run.stderr[-2000:]
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert (q["bits"], q["group_size"]) == (8, 32)
    assert abs(bpw(out) - (8 + 32 / 32)) < 0.3  # 8 bits + 16-bit scale and bias a group
    generates(out)
    cast = tmp_path / "f16"
    run = mlxbun("convert", src, cast, "--dtype", "float16")
    assert run.returncode == 0, run.stderr[-2000:]
    import mlx.core as mx

    weights = mx.load(str(cast / "model.safetensors"))
    assert {str(v.dtype) for v in weights.values()} == {"mlx.core.float16"}
    assert "quantization" not in json.loads((cast / "config.json").read_text())


@pytest.mark.parametrize("target,calibrated", [(5.0, False), (6.0, True)])
def test_target_bpw_lands_near_the_target_and_the_model_serves(src, tmp_path, target,
                                                               calibrated):
    out = tmp_path / "mixed"
    extra: list[str] = []
    if calibrated:
        data = tmp_path / "cal.jsonl"
        data.write_text("\n".join(json.dumps({"text": f"Row {i}: the quick brown fox jumps "
                                              f"over the lazy dog {i * 7} times. " * 4})
                                  for i in range(40)))
        extra = ["--calibration-data", str(data), "--n-calibration", "4"]
    run = mlxbun("convert", src, "--mlx-path", out, "--target-bpw", str(target), *extra)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ("from " + str(tmp_path) if calibrated else "data-free") in run.stderr
    got = bpw(out)
    assert target - 0.25 <= got <= target, got  # at or under, and near
    q = json.loads((out / "config.json").read_text())["quantization"]
    per_layer = {k: v["bits"] for k, v in q.items() if isinstance(v, dict)}
    assert q["bits"] == 4 and per_layer and set(per_layer.values()) == {8}
    generates(out)


def test_refusals_come_before_any_work(src, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    cases = [
        (["convert", src, taken, "-q"], "already exists"),
        (["convert", src, tmp_path / "a", "-q", "--upload-repo", "me/model"], "hub write token"),
        (["convert", src, tmp_path / "b", "--target-bpw", "2"], "outside what 4- and 8-bit"),
        (["convert", src, tmp_path / "c", "--target-bpw", "5", "--quant-predicate",
          "mixed_3_6"], "pass one"),
        (["convert", src, tmp_path / "d", "-q", "-d"], "opposites"),
        (["convert", tmp_path / "nowhere", tmp_path / "e", "-q"], "nowhere"),
    ]
    for args, said in cases:
        run = mlxbun(*args)
        assert run.returncode == 2, (args, run.stderr[-1000:])
        assert said in run.stderr, (args, run.stderr[-1000:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # nothing was written


def test_upload_repo_pushes_the_result(src, tmp_path):
    with FakeHub({}, tokens=(TOKEN,)) as hub, hub_environment(tmp_path / "hubroot", hub):
        env = {**os.environ, "HF_TOKEN": TOKEN}
        run = mlxbun("convert", src, tmp_path / "up", "-q", "--upload-repo", "tester/tiny-4bit",
                     env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        pushed = hub.repos["tester/tiny-4bit"].files
    assert pushed["model.safetensors"] == (tmp_path / "up" / "model.safetensors").read_bytes()


def test_a_gguf_source_is_still_imported(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_gguf import write_tiny_gguf

    g = tmp_path / "Tiny.Q8_0.gguf"
    write_tiny_gguf(g)
    run = mlxbun("convert", g, tmp_path / "from-gguf")
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "from-gguf" / "config.json").is_file()


def test_the_quantize_job_takes_a_target_bpw_too(src, tmp_path):
    """``mlxbun quantize`` (the web app's quantize job, in the foreground): the same plan."""
    out = tmp_path / "job"
    run = mlxbun("quantize", src, "--target-bpw", "5.5", "--out", out)
    assert run.returncode == 0, run.stderr[-2000:]
    assert 5.25 <= bpw(out) <= 5.5
    far = mlxbun("quantize", src, "--target-bpw", "12", "--out", tmp_path / "far")
    assert far.returncode != 0 and "outside what 4- and 8-bit" in far.stderr + far.stdout
