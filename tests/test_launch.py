"""``mlxbun launch claude|codex``: the real clients (npm, ``npm_clients``) run against a
server it finds or starts, with everything they need in their environment; a server it
started stops when the client exits; a missing client gets its npm command and starts
nothing. The model is a tiny one-sliding-layer checkpoint (linear prefill), so Claude
Code's ~30k-token prompt takes seconds; what it answers is random text, so the tests check
the exchange (a result, no error, the served model's name on the wire), not the words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mlxbun_core import launch
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.clients import long_context_options
from mlxbun_core.testing.server import free_port, start_server

RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint(seed=77, **long_context_options())


def run_launch(args: list[str], *, home: Path, npm_bin: Path | None,
               cwd: Path) -> subprocess.CompletedProcess:
    """``mlxbun launch ARGS`` in a child, as a user would type it: a throwaway HOME, the
    npm clients on PATH (or not), no keys of the person running the tests."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "CLAUDE_"))}
    path = env.get("PATH", "")
    env.update(HOME=str(home), NO_COLOR="1", TERM="dumb",
               PATH=f"{npm_bin}{os.pathsep}{path}" if npm_bin else path)
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "launch", *args],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)


def listening(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    except httpx.TransportError:
        return False
    return True


def test_claude_against_a_server_it_starts_and_stops(ckpt, npm_clients, tmp_path):
    port = free_port()
    done = run_launch([
        "claude", str(ckpt), "--port", str(port), "--",
        "-p", "Say hi.", "--output-format", "json", "--max-turns", "1"],
        home=tmp_path / "home", npm_bin=npm_clients["claude"].parent, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"starting `mlxbun serve {ckpt} --port {port}`" in done.stderr
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["subtype"] == "success"
    usage = result["usage"]  # its breakpoints split the prompt: creation, read, the rest
    prompt = sum(usage.get(k) or 0 for k in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    assert prompt > 10_000  # Claude Code's whole prompt was read
    assert "stopping the server it started" in done.stderr
    assert not listening(port)  # drained and gone with the client
    log = (Path(os.environ["MLXBUN_HOME"]) / "logs" / f"launch-serve-{port}.log").read_text()
    assert f"serving {ckpt.name}" in log and "batched lane" in log


def test_codex_against_a_running_server_it_leaves_running(ckpt, npm_clients, tmp_path):
    srv = start_server(ckpt)
    try:
        done = run_launch([
            "codex", "--port", str(srv.port), "--",
            "exec", "--skip-git-repo-check", "--json", "--sandbox", "danger-full-access",
            "Say hi."], home=tmp_path / "home", npm_bin=npm_clients["codex"].parent,
            cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert f"using the server at {srv.base_url} ({ckpt.name})" in done.stderr
        assert "starting" not in done.stderr and "stopping" not in done.stderr
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert [e for e in events if e.get("type") == "turn.completed"]
        assert not [e for e in events if e.get("type") in ("turn.failed", "error")]
        assert srv.engine.completed >= 1 and listening(srv.port)  # still ours to stop
    finally:
        srv.stop()


def test_a_missing_client_gets_its_npm_command_and_no_server(ckpt, tmp_path):
    port = free_port()
    done = run_launch(["claude", str(ckpt), "--port", str(port)], home=tmp_path / "home",
                      npm_bin=None, cwd=tmp_path)
    assert done.returncode == 127
    assert "npm install -g @anthropic-ai/claude-code" in done.stderr
    assert "starting" not in done.stderr and not listening(port)


def test_a_server_that_does_not_serve_the_named_model_is_not_used(ckpt, npm_clients, tmp_path):
    srv = start_server(ckpt)
    try:
        done = run_launch(["claude", "some/other-model", "--port", str(srv.port)],
                          home=tmp_path / "home", npm_bin=npm_clients["claude"].parent,
                          cwd=tmp_path)
        assert done.returncode == 2
        assert f"does not serve 'some/other-model' (it serves {ckpt.name})" in done.stderr
    finally:
        srv.stop()


def test_a_server_that_wants_a_key_says_so(ckpt, npm_clients, tmp_path):
    srv = start_server(ckpt, api_key="sk-launch")
    try:
        done = run_launch(["claude", "--port", str(srv.port)], home=tmp_path / "home",
                          npm_bin=npm_clients["claude"].parent, cwd=tmp_path)
        assert done.returncode == 2 and "wants an API key: pass --api-key" in done.stderr
    finally:
        srv.stop()


def test_the_clients_are_pointed_at_the_served_model(tmp_path):
    server = launch.Server("http://127.0.0.1:9999", "acme/Coder-7B", 32768, None)
    env = launch.claude_env(server)
    assert env["ANTHROPIC_BASE_URL"] == server.base_url and env["ANTHROPIC_AUTH_TOKEN"]
    assert {env[k] for k in launch.CLAUDE_MODEL_SLOTS} == {"acme/Coder-7B"}
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    keyed = launch.Server(server.base_url, "acme/Coder-7B", 32768, "sk-1")
    codex = launch.codex_home(keyed, tmp_path)
    config = (Path(codex["CODEX_HOME"]) / "config.toml").read_text()
    top, provider = config.split("[model_providers.mlxbun]\n")
    for line in ('model = "acme/Coder-7B"', 'model_provider = "mlxbun"',
                 "model_context_window = 32768"):
        assert line in top.splitlines()
    for line in (f'base_url = "{server.base_url}/v1"', 'wire_api = "responses"',
                 'env_key = "MLXBUN_API_KEY"', "stream_idle_timeout_ms = 3600000"):
        assert line in provider.splitlines()
    assert codex["MLXBUN_API_KEY"] == "sk-1"
    assert launch.split_args(["--port", "1", "--", "-p", "--", "x"]) == (
        ["--port", "1"], ["-p", "--", "x"])
