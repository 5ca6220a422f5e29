"""The API key and the loopback-only admin routes, against real servers: one reached
over loopback, one reached through this machine's own non-loopback address.

Every answer is checked for its exact status and body, so a guard that let a wrong key
through (the route's own 200) or failed (a 500) fails these tests, not only one that
forgot to refuse."""

from __future__ import annotations

import socket

import anthropic
import httpx
import openai
import pytest

from mlxbun_core.server.guard import LOOPBACK_ONLY
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

KEY = "sekrit"
UNAUTHORIZED = {"error": {"message": "invalid or missing API key (send Authorization: Bearer "
                                     "<key>)", "type": "authentication_error"}}
UNAUTHORIZED_ANTHROPIC = {"type": "error", "error": {
    "type": "authentication_error",
    "message": "invalid or missing API key (send Authorization: Bearer <key>)"}}
FORBIDDEN = {"error": {"message": LOOPBACK_ONLY, "type": "permission_error"}}
ADAPTERS = {"adapters": [], "default": None}  # GET /v1/adapters with none mounted
NO_HITS = {"ok": True, "results": []}  # GET /api/sessions/search?q=... in an empty directory


def outward_ip() -> str:
    """An address of this machine that is not loopback (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only, nothing leaves
        ip = s.getsockname()[0]
    assert not ip.startswith("127."), "this machine needs a non-loopback interface"
    return ip


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    s = start_server(tiny_checkpoint("qwen3"), host="0.0.0.0",
                     sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    s = start_server(tiny_checkpoint("qwen3"), host="0.0.0.0", api_key=KEY,
                     sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


def answer(r: httpx.Response) -> tuple:
    return r.status_code, r.json()


def test_admin_routes_refuse_remote_clients_without_a_key(open_server):
    remote = f"http://{outward_ip()}:{open_server.port}"
    assert answer(httpx.get(remote + "/v1/adapters")) == (403, FORBIDDEN)
    assert answer(httpx.get(remote + "/api/sessions/search", params={"q": "x"})) == (403, FORBIDDEN)
    assert answer(httpx.post(remote + "/api/jobs", json={})) == (403, FORBIDDEN)
    assert answer(httpx.get(remote + "/ws/chat")) == (403, FORBIDDEN)
    # the same routes answer loopback clients with their own answers
    local = open_server.base_url
    assert answer(httpx.get(local + "/v1/adapters")) == (200, ADAPTERS)
    assert answer(httpx.get(local + "/api/sessions/search", params={"q": "x"})) == (200, NO_HITS)
    # generation routes stay open to the network
    r = httpx.post(remote + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_api_key_is_required_on_every_route(keyed_server):
    base = keyed_server.base_url
    assert answer(httpx.get(base + "/v1/models")) == (401, UNAUTHORIZED)
    for headers in ({"Authorization": "Bearer nope"}, {"x-api-key": "nope"},
                    {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"}):
        assert answer(httpx.get(base + "/v1/models", headers=headers)) == (401, UNAUTHORIZED)
        assert answer(httpx.get(base + "/metrics", headers=headers)) == (401, UNAUTHORIZED)
    r = httpx.post(base + "/v1/messages", headers={"x-api-key": "nope"},
                   json={"model": "m", "max_tokens": 2, "messages": []})
    assert answer(r) == (401, UNAUTHORIZED_ANTHROPIC)
    assert answer(httpx.get(base + "/health")) == (200, {"status": "ok"})  # probes need no key
    ok = openai.OpenAI(base_url=keyed_server.v1, api_key=KEY, max_retries=0)
    assert ok.completions.create(model="m", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert [m.id for m in ok.models.list()][0] == keyed_server.engine.model.id
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.v1, api_key="nope", max_retries=0).models.list()
    an = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0)
    assert an.messages.create(model="m", max_tokens=2, messages=[
        {"role": "user", "content": "hi"}]).usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base, api_key="nope", max_retries=0).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    metrics = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert metrics.status_code == 200  # the refusals above are counted, by route template
    model = keyed_server.engine.model.id
    assert f'mlxbun_http_requests_total{{method="GET",model="{model}",route="/v1/models",' \
        f'status="401"}} 6.0' in metrics.text.splitlines()


def test_a_key_lets_remote_clients_reach_admin_routes(keyed_server):
    remote = f"http://{outward_ip()}:{keyed_server.port}"
    for base in (remote, keyed_server.base_url):  # with a key, loopback is no pass either
        for path, ok in (("/v1/adapters", ADAPTERS), ("/api/sessions/search?q=x", NO_HITS)):
            assert answer(httpx.get(base + path)) == (401, UNAUTHORIZED)
            wrong = httpx.get(base + path, headers={"Authorization": "Bearer wrong"})
            assert answer(wrong) == (401, UNAUTHORIZED)
            wrong = httpx.get(base + path, headers={"x-api-key": KEY[:-1]})
            assert answer(wrong) == (401, UNAUTHORIZED)
            right = httpx.get(base + path, headers={"Authorization": f"Bearer {KEY}"})
            assert answer(right) == (200, ok)
            right = httpx.get(base + path, headers={"x-api-key": KEY})
            assert answer(right) == (200, ok)
