"""Plugin discovery: entry points, allow/deny lists, broken plugins, third-party families."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from mlxbun_core.testing.checkpoints import write_checkpoint
from mlxbun_core.testing.process import serve

ROOT = Path(__file__).resolve().parents[1]
MLXBUN = [sys.executable, "-m", "mlxbun_core.cli"]


def run_cli(*args, env=None, **kw):
    return subprocess.run(MLXBUN + list(args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, **kw)


def fake_dist(site: Path, name: str, module: str, source: str):
    """Install a one-module distribution into ``site`` exactly as pip lays it out."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{name}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[mlxbun]\n{name} = {module}\n")


def test_plugins_lists_generic_with_its_hooks():
    out = run_cli("plugins")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("generic "))
    assert lines[i].endswith("family generic")
    assert all(h in lines[i + 1] for h in ("claims", "load_model", "render_chat"))
    j = next(i for i, line in enumerate(lines) if line.startswith("draft_model "))
    assert "family" not in lines[j] and "draft_source" in lines[j + 1]  # an extension


def test_broken_plugin_is_reported_and_skipped(tmp_path):
    fake_dist(tmp_path, "brokenfam", "brokenfam_mod",
              "raise ImportError('missing dependency xyz')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    out = run_cli("plugins", env=env)
    assert out.returncode == 0
    assert "brokenfam" in out.stdout and "FAILED" in out.stdout
    assert "missing dependency xyz" in out.stdout
    assert "generic" in out.stdout
    denied = run_cli("plugins", env={**env, "MLXBUN_DISABLE_PLUGINS": "brokenfam"})
    assert "brokenfam" not in denied.stdout
    allowed = run_cli("plugins", env={**env, "MLXBUN_PLUGINS": "nothing-else"})
    assert "brokenfam" not in allowed.stdout and "generic" in allowed.stdout


def build_with_installed_setuptools() -> list[str]:
    """pip's flag to build the example with this environment's setuptools when it meets the
    example's ``setuptools>=77`` (the test extra installs one): no isolated build
    environment to fetch and install (most of this test's time)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("setuptools").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if major >= 77 else []


def test_third_party_family_served_through_its_entry_point(tmp_path):
    """The docs example, installed with pip, claims its checkpoint in a real `mlxbun serve`."""
    site, src = tmp_path / "site", tmp_path / "src"
    shutil.copytree(ROOT / "docs/examples/mlxbun_echo_family", src)  # builds leave build/ there
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          *build_with_installed_setuptools(), "--target", str(site), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    ckpt = write_checkpoint(tmp_path / "echo", "llama")
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["EchoLlamaForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with serve(ckpt, env={"PYTHONPATH": str(site)}, ready=None) as proc:
        banner = proc.wait_for_line("serving", timeout=90)
        assert "via plugin 'echo'" in banner
        base = proc.base
        proc.wait_for_http(base + "/health", timeout=30)
        row = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]
        assert row["plugin"] == "echo" and row["family"] == "echo"
        tools = [{"type": "function",
                  "function": {"name": "add", "parameters": {"type": "object"}}}]
        r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "tools": tools})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        # the prompt is the example's own transcript, not the checkpoint's chat template
        transcript = ("System: to use a tool (add) write CALL name {json arguments}\n"
                      "User: hi\nAssistant:")
        tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
        assert r.json()["usage"]["prompt_tokens"] == len(tokenizer.encode(transcript))


def test_missing_model_is_a_clear_error(tmp_path):
    out = run_cli("serve", str(tmp_path / "no-such-model"))
    assert out.returncode == 2
    assert str(tmp_path / "no-such-model") in out.stderr
