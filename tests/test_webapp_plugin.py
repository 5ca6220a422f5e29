"""The web app is a plugin (``webapp``): blocked, a real ``mlxbun serve`` still answers every
inference API through the official clients, while the app's pages, ``/api/*`` routes,
chat socket and verbs are gone. Served as usual (in-process), they are all there."""

import ast
import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

import mlxbun_core
from mlxbun_core.server.meta import NO_WEB_APP
from mlxbun_core.server.state import AppState
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import serve
from mlxbun_core.testing.server import running_server
from mlxbun_core.webapp.state import of as web_state

CLI = [sys.executable, "-m", "mlxbun_core.cli"]
NO_APP = {**os.environ, "MLXBUN_DISABLE_PLUGINS": "webapp"}
APP_PATHS = ["/", "/api/jobs", "/api/sessions/search?q=hello", "/api/hub/local", "/curves"]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def bare(ckpt):
    """``mlxbun serve`` with the web app blocked: its base URL."""
    with serve(ckpt, "--no-open", "--max-tokens", "8", env=NO_APP, timeout=180) as proc:
        yield proc.base, proc


def test_every_inference_api_answers_without_the_web_app(bare):
    base, _ = bare
    oa = openai.OpenAI(base_url=base + "/v1", api_key="none")
    model = oa.models.list().data[0].id
    chat = oa.chat.completions.create(model=model, max_tokens=4,
                                      messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage.completion_tokens >= 1
    text = oa.completions.create(model=model, prompt="hello", max_tokens=3)
    assert text.usage.completion_tokens >= 1
    stream = oa.chat.completions.create(model=model, max_tokens=3, stream=True,
                                        messages=[{"role": "user", "content": "hi"}])
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] in ("stop", "length")
    resp = oa.responses.create(model=model, input="hi", max_output_tokens=4)
    assert resp.status in ("completed", "incomplete")
    assert oa.responses.retrieve(resp.id).id == resp.id
    msg = anthropic.Anthropic(base_url=base, api_key="none").messages.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens >= 1
    tokens = httpx.post(base + "/tokenize", json={"model": model, "prompt": "hello"}).json()
    assert tokens["tokens"]
    for path in ("/health", "/stats", "/library", "/v1/adapters"):
        assert httpx.get(base + path).status_code == 200, path


def test_the_web_app_is_gone_when_blocked(bare):
    base, _ = bare
    for path in APP_PATHS:
        r = httpx.get(base + path)
        assert r.status_code == 404, (path, r.status_code)
        assert r.json()["error"]["type"] == "not_found_error"
    index = httpx.get(base + "/v1").json()
    assert index["web_chat"] == {"available": False, "reason": NO_WEB_APP}
    assert not any("/api/" in e for e in index["endpoints"])


def test_the_web_app_is_there_when_served(ckpt, tmp_path):
    with running_server(ckpt, max_tokens=8, sessions_dir=tmp_path) as srv:
        base = f"http://127.0.0.1:{srv.port}"
        for path in APP_PATHS:
            assert httpx.get(base + path).status_code == 200, path
        index = httpx.get(base + "/v1").json()
        assert index["web_chat"] == {"available": True, "reason": None}
        assert "GET /api/jobs" in index["endpoints"]
        app = srv.server.config.app
        assert web_state(app).sessions.root == tmp_path  # the record build_app was handed
        assert list(app.state.plugins) == ["webapp"]


WEB_APP_ROOMS = ("webapp", "webchat", "jobs", "hub", "memory")


def test_the_core_app_holds_nothing_of_the_web_app():
    """The web app's sessions, job queues and chat switches live behind its plugin: no
    module of ``server/`` imports the rooms they come from, and ``AppState`` has no field
    of theirs."""
    server = Path(mlxbun_core.__file__).parent / "server"
    reached = []
    for path in sorted(server.rglob("*.py")):
        package = "mlxbun_core." + ".".join(path.relative_to(server.parent).with_suffix("")
                                            .parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                name = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                   package) if node.level else node.module
                room = (name or "").split(".")[1:2]
                if room and room[0] in WEB_APP_ROOMS:
                    reached.append(f"{path.name}: {name}")
    assert reached == []
    fields = {f.name for f in dataclasses.fields(AppState)}
    assert not fields & {"sessions", "jobs", "hub_jobs", "web_chat_unavailable", "mcp_servers"}


def test_the_banner_offers_no_page_without_the_web_app(bare):
    _, proc = bare
    assert "serving" in proc.output
    assert "http://127.0.0.1" in proc.output  # the API's address is printed
    assert "web app" not in proc.output.lower()


def run(*args, env=None):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120,
                          env=env or dict(os.environ))


def test_the_web_apps_verbs_come_and_go_with_its_plugin():
    listed = run("plugins").stdout
    assert "webapp (built into" in listed and "api (built into" in listed
    assert "register_routes" in listed and "register_commands" in listed
    assert run("memory", "--help").returncode == 0
    assert run("train", "--help").returncode == 0
    blocked = run("plugins", env=NO_APP).stdout
    assert "webapp" not in blocked and "api (built into" in blocked
    for verb in ("memory", "train", "quantize", "train-watch", "fuse"):
        r = run(verb, "--help", env=NO_APP)
        assert r.returncode == 2 and "invalid choice" in r.stderr, (verb, r.stderr)
    assert run("ls", "--help", env=NO_APP).returncode == 0  # the core's verbs stay
