"""Refused requests leave a trace, HEAD answers on GET routes, and /health says
``loading`` until the engine answers: read from real ``mlxbun serve`` processes' logs
(in-process and ``--isolate``), with real clients."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import websockets.sync.client
from websockets.exceptions import InvalidStatus

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import ServerProcess, serve

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}


def access_lines(proc: ServerProcess, needle: str, timeout: float = 10) -> str:
    """The access-log line for ``needle`` (``METHOD PATH STATUS``) once it is printed."""
    return proc.wait_for_line(f"mlxbun.access: {needle}", timeout)


@pytest.fixture(scope="module")
def served():
    """`mlxbun serve` with an API key and a small body cap; the first /health answer is
    taken as soon as the port answers at all."""
    proc = serve(tiny_checkpoint("llama", seed=8), "--api-key", KEY, "--no-open",
                 env={"MLXBUN_MAX_BODY_BYTES": "4096"}, ready=None)
    first = proc.wait_for_http(proc.base + "/health", timeout=120)
    banner_first = "mlxbun: serving" in proc.output
    yield proc, proc.base, (first, banner_first)
    proc.stop()


def test_the_plain_server_answers_health_only_once_loaded(served):
    """No window where it says ok before the model is ready: the port opens with the
    model loaded (the banner is out before the first answer)."""
    _, _, (first, banner_first) = served
    assert first.status_code == 200 and first.json() == {"status": "ok"}
    assert banner_first


def test_every_refusal_gets_a_line_at_info(served):
    proc, base, _ = served
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    client.chat.completions.create(model="m", max_tokens=2, temperature=0,
                                   messages=[{"role": "user", "content": "hi"}])
    proc.wait_for_line("mlxbun.engine: ", 30)  # a served request's line, at INFO
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[])
    line = access_lines(proc, "POST /v1/chat/completions 400")
    assert "messages" in line, line
    assert httpx.post(base + "/v1/chat/completions", json={}).status_code == 401  # the guard
    assert "invalid or missing API key" in access_lines(proc, "POST /v1/chat/completions 401")
    assert httpx.get(base + "/nope", headers=AUTH).status_code == 404
    assert "not found" in access_lines(proc, "GET /nope 404")
    assert httpx.get(base + "/v1/chat/completions", headers=AUTH).status_code == 405
    assert "use POST" in access_lines(proc, "GET /v1/chat/completions 405")
    big = httpx.post(base + "/v1/chat/completions", headers=AUTH,
                     json={"messages": [{"role": "user", "content": "x" * 8000}]})
    assert big.status_code == 413
    assert "4096" in access_lines(proc, "POST /v1/chat/completions 413")
    with pytest.raises(InvalidStatus) as refused:  # a WebSocket the guard turns away
        websockets.sync.client.connect(base.replace("http", "ws") + "/ws/chat",
                                       open_timeout=10)
    assert refused.value.response.status_code == 401
    access_lines(proc, "GET /ws/chat 401")
    assert "mlxbun.access: GET /health" not in proc.output  # probes stay out of it


def test_head_answers_on_get_routes(served):
    """Claude Code sends HEAD / first; every GET route answers HEAD with its status and
    headers and no body; a POST-only route still says 405."""
    _, base, _ = served
    for path in ("/", "/v1/models", "/health"):
        head = httpx.head(base + path, headers=AUTH, timeout=30)
        get = httpx.get(base + path, headers=AUTH, timeout=30)
        assert (head.status_code, head.content) == (200, b""), path
        assert head.headers["content-type"] == get.headers["content-type"], path
    assert httpx.head(base + "/", timeout=30).status_code == 200  # the web app's open shell
    assert httpx.head(base + "/v1/chat/completions", headers=AUTH).status_code == 405
    assert httpx.head(base + "/v1/models").status_code == 401  # the guard's rules, as GET


def test_isolate_health_says_loading_until_the_engine_answers():
    """`--isolate`: the parent answers at once, 503 `loading` until its engine child has
    answered (it said ok while the engine was still loading); its own refusals are
    logged by it, the engine's by the engine; HEAD / goes through."""
    with serve(tiny_checkpoint("llama", seed=8), "--isolate", "--no-open", ready=None) as proc:
        base = proc.base
        first = proc.wait_for_http(base + "/health", timeout=60)
        assert (first.status_code, first.json()) == (503, {"status": "loading"}), proc.output
        deadline = time.monotonic() + 180
        while (health := httpx.get(base + "/health")).status_code != 200:
            assert time.monotonic() < deadline, proc.output
            assert health.json() == {"status": "loading"}
            time.sleep(0.2)
        assert httpx.get(base + "/engine").json()["state"] == "ready"
        assert httpx.get(base + "/health").json() == {"status": "ok"}
        assert httpx.get(base + "/v1/models/nope").status_code == 404  # the parent's answer
        assert "does not exist" in access_lines(proc, "GET /v1/models/nope 404")
        assert httpx.post(base + "/v1/completions", json={"prompt": ""}).status_code == 400
        assert "prompt" in access_lines(proc, "POST /v1/completions 400")  # the engine's
        assert httpx.head(base + "/", timeout=30).status_code == 200
