"""The API key and the loopback-only admin routes, against real servers: one reached
over loopback, one reached through this machine's own non-loopback address."""

from __future__ import annotations

import socket

import anthropic
import httpx
import openai
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server


def outward_ip() -> str:
    """An address of this machine that is not loopback (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only, nothing leaves
        ip = s.getsockname()[0]
    assert not ip.startswith("127."), "this machine needs a non-loopback interface"
    return ip


@pytest.fixture(scope="module")
def open_server():
    s = start_server(tiny_checkpoint("qwen3"), host="0.0.0.0")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed_server():
    s = start_server(tiny_checkpoint("qwen3"), host="0.0.0.0", api_key="sekrit")
    yield s
    s.stop()


def test_admin_routes_refuse_remote_clients_without_a_key(open_server):
    remote = f"http://{outward_ip()}:{open_server.port}"
    r = httpx.get(remote + "/v1/adapters")
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert "loopback" in r.json()["error"]["message"]
    assert httpx.post(remote + "/api/jobs", json={}).status_code == 403
    # the same routes from loopback pass the guard (404 here: the route may not exist)
    assert httpx.get(open_server.base_url + "/v1/adapters").status_code != 403
    # generation routes stay open to the network
    r = httpx.post(remote + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200


def test_api_key_is_required_on_every_route(keyed_server):
    base = keyed_server.base_url
    assert httpx.get(base + "/v1/models").status_code == 401
    wrong = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.get(base + "/health").status_code == 200  # liveness probes need no key
    ok = openai.OpenAI(base_url=keyed_server.v1, api_key="sekrit", max_retries=0)
    assert ok.completions.create(model="m", prompt="hi", max_tokens=2).usage.completion_tokens
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.v1, api_key="nope", max_retries=0).models.list()
    an = anthropic.Anthropic(base_url=base, api_key="sekrit", max_retries=0)
    assert an.messages.create(model="m", max_tokens=2, messages=[
        {"role": "user", "content": "hi"}]).usage.output_tokens
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base, api_key="nope", max_retries=0).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])


def test_a_key_lets_remote_clients_reach_admin_routes(keyed_server):
    remote = f"http://{outward_ip()}:{keyed_server.port}"
    headers = {"Authorization": "Bearer sekrit"}
    assert httpx.get(remote + "/v1/adapters").status_code == 401
    assert httpx.get(remote + "/v1/adapters", headers=headers).status_code != 403
