"""Memory pressure over real HTTP with the official SDKs: injected out-of-memory failures
at random steps under 32 clients end with every request answered (or told 503), none
hung and the pool empty; a request memory cannot hold is a 503 with ``Retry-After`` in
its surface's own shape, streaming or not; a sticky device fault turns ``/health`` 503
and every request into a 503 to send again."""

from __future__ import annotations

import functools
import random
import threading

import anthropic
import httpx
import openai
import pytest

from mlxbun_core.engine.memory import MemoryConfig
from mlxbun_core.engine.readings import Reading
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import _blocks_left
from mlxbun_core.testing.server import start_server

CLIENTS = 32


def clients(srv):
    return (openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0, timeout=120),
            anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0,
                                timeout=120))


def ask(oa, an, i: int) -> tuple[str, str]:
    """Client ``i``'s request, by surface and streaming or not; ``(kind, text)``."""
    prompt = f"Story {i}: " + "once upon a time " * (1 + i % 5)
    kind = ("chat", "chat-stream", "completions", "messages", "messages-stream")[i % 5]
    if kind == "chat":
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                       max_tokens=24, temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop")
        return kind, r.choices[0].message.content or ""
    if kind == "chat-stream":
        chunks = list(oa.chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}], max_tokens=24,
            temperature=0, stream=True))
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")
        return kind, "".join(c.choices[0].delta.content or "" for c in chunks)
    if kind == "completions":
        c = oa.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0)
        assert c.choices[0].finish_reason in ("length", "stop")
        return kind, c.choices[0].text
    if kind == "messages":
        m = an.messages.create(model="m", max_tokens=24, extra_body={"temperature": 0},
                               messages=[{"role": "user", "content": prompt}])
        assert m.stop_reason in ("max_tokens", "end_turn")
        return kind, "".join(b.text for b in m.content if b.type == "text")
    with an.messages.stream(model="m", max_tokens=24, extra_body={"temperature": 0},
                            messages=[{"role": "user", "content": prompt}]) as s:
        text = "".join(s.text_stream)
        assert s.get_final_message().stop_reason in ("max_tokens", "end_turn")
    return kind, text


def retry_after(exc: Exception) -> int:
    """A 503's ``Retry-After``, checked sane."""
    assert isinstance(exc, (openai.APIStatusError, anthropic.APIStatusError)), repr(exc)
    assert exc.status_code == 503, exc
    value = int(exc.response.headers["retry-after"])
    assert 1 <= value <= 60
    return value


def test_injected_out_of_memory_under_32_clients_ends_with_every_request_answered():
    every = random.Random().randint(7, 12)  # which steps fail moves with every run
    srv = start_server(tiny_checkpoint("llama"), batch=16,
                       memory=MemoryConfig(fault_alloc=every))
    try:
        oa, an = clients(srv)
        results: list = [None] * CLIENTS

        def run(i: int) -> None:
            try:
                results[i] = ask(oa, an, i)
            except Exception as exc:  # told 503, or a failure the test reports
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), f"hung (failing every {every})"
        answered = [r for r in results if isinstance(r, tuple)]
        for r in results:
            if not isinstance(r, tuple):
                retry_after(r)  # anything but an answer is a 503 with Retry-After
        assert len(answered) >= CLIENTS // 2, (every, results)
        assert all(text for _, text in answered)
        stats = httpx.get(srv.base_url + "/stats", timeout=30).json()["memory"]
        assert stats["out_of_memory"] >= 1 and stats["preemptions"] >= 1, (every, stats)
        assert stats["fault_injection"]["alloc_every"] == every
        metrics = httpx.get(srv.base_url + "/metrics", timeout=30).text
        assert "mlxbun_memory_preemptions_total" in metrics
        assert "mlxbun_kv_blocks_used" in metrics
        assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
        engine = srv.engine
        assert engine.worker.run_sync(functools.partial(_blocks_left, engine)) == 0
    finally:
        srv.stop()
        srv.engine.close()


@pytest.fixture(scope="module")
def tight():
    """A server where another process holds all memory: every request waits half a
    second, then is told 503."""
    srv = start_server(tiny_checkpoint("llama"), batch=4,
                       memory=MemoryConfig(margin_bytes=0, wait_s=0.5))
    srv.engine.memory.probe = lambda: Reading(0, 0, "test")
    yield srv
    srv.stop()
    srv.engine.close()


BODY = {"model": "m", "max_tokens": 8, "temperature": 0}
CHAT = {**BODY, "messages": [{"role": "user", "content": "Hello"}]}
SURFACES = {
    "chat": ("/v1/chat/completions", CHAT),
    "completions": ("/v1/completions", {**BODY, "prompt": "Hello"}),
    "messages": ("/v1/messages", CHAT),
    "responses": ("/v1/responses", {"model": "m", "input": "Hello", "max_output_tokens": 8}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("surface", SURFACES)
def test_a_request_memory_cannot_hold_is_a_503_in_its_surfaces_shape(tight, surface, stream):
    path, body = SURFACES[surface]
    r = httpx.post(tight.base_url + path, json={**body, "stream": stream}, timeout=60)
    assert r.status_code == 503, r.text
    assert 1 <= int(r.headers["retry-after"]) <= 30
    assert r.headers["content-type"].startswith("application/json")  # not a 200 stream
    err = r.json()["error"]
    if surface == "messages":
        assert r.json()["type"] == "error" and err["type"] == "overloaded_error"
    elif surface == "responses":
        assert err["type"] == "server_error" and err["code"] == "memory_pressure"
    else:
        assert err["type"] == "overloaded_error" and err["code"] == "memory_pressure"
    assert "memory" in err["message"]
    assert httpx.get(tight.base_url + "/health", timeout=30).status_code == 200


def test_the_sdks_see_the_503_and_its_retry_after_and_the_server_serves_after(tight):
    oa, an = clients(tight)
    with pytest.raises(openai.APIStatusError) as refused:
        oa.chat.completions.create(**CHAT, stream=True)
    retry_after(refused.value)
    with pytest.raises(anthropic.APIStatusError) as told:
        an.messages.create(model="m", max_tokens=8, messages=CHAT["messages"])
    retry_after(told.value)
    assert isinstance(told.value, anthropic.InternalServerError)  # a 5xx a client retries
    stats = httpx.get(tight.base_url + "/stats", timeout=30).json()["memory"]
    assert stats["refused"] >= 2
    tight.engine.memory.probe = lambda: Reading(1 << 30, 0, "test")  # memory is back
    tight.engine.memory.available(fresh=True)  # (read now, not within the second)
    try:
        done = oa.chat.completions.create(**CHAT)
        assert done.choices[0].finish_reason in ("length", "stop")
    finally:
        tight.engine.memory.probe = lambda: Reading(0, 0, "test")


def test_a_sticky_device_fault_turns_health_503_and_requests_into_503s_to_resend():
    srv = start_server(tiny_checkpoint("llama"), memory=MemoryConfig(fault_device=2))
    try:
        assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
        r = httpx.post(srv.base_url + "/v1/completions", json={**BODY, "prompt": "Hello"},
                       timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "device_fault"
        assert r.headers["x-mlxbun-restarting"] == "1" and int(r.headers["retry-after"]) >= 2
        health = httpx.get(srv.base_url + "/health", timeout=30)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert "illegal memory access" in health.json()["reason"]
        again = httpx.post(srv.base_url + "/v1/messages", json=CHAT, timeout=60)
        assert again.status_code == 503 and again.json()["error"]["type"] == "overloaded_error"
        assert "retry-after" in again.headers
        assert httpx.get(srv.base_url + "/stats", timeout=30).json()["memory"][
            "device"] == "lost"
    finally:
        srv.stop()
        srv.engine.close()
