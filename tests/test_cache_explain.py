"""A prefix cache that explains itself: every generation response carries
``X-Mlxbun-Cache`` (streams too), ``/stats.prompt_cache.recent`` says why a prompt hit as
far as it did (a divergence with the text around it, an evicted entry, another
namespace), and ``mlxbun cache explain`` prints it. Real servers on loopback, real tiny
checkpoints, the official SDKs."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from mlxbun_core import cli
from mlxbun_core.engine.prepare import prepare
from mlxbun_core.testing.adapters import write_lora_adapter
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, settled
from mlxbun_core.testing.server import start_server

PREAMBLE = ("You are a careful assistant working in a repository of Python code. Read the "
            "files before you edit them, run the tests after every change, and say what "
            "you did in one short paragraph. ")
HEADER = "x-mlxbun-cache"


def fields(value: str) -> dict[str, str]:
    """``hit=3/9; reason=diverged; at=3`` as a dict."""
    return dict(part.split("=", 1) for part in value.split("; "))


def hit(value: str) -> tuple[int, int]:
    got, total = fields(value)["hit"].split("/")
    return int(got), int(total)


def tokens(srv, prompt: str) -> list[int]:
    """The prompt tokens the engine runs for a completions body."""
    engine = srv.engine
    req = engine.parse_completion({"prompt": prompt, "max_tokens": 2})
    return prepare(engine.model, engine.hooks, req).request.prompt_tokens


def complete(srv, prompt: str, **extra) -> str:
    r = httpx.post(srv.v1 + "/completions", json={"prompt": prompt, "max_tokens": 2,
                                                  "temperature": 0, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers[HEADER]


def recent(srv) -> list[dict]:
    return httpx.get(srv.base_url + "/stats", timeout=30).json()["prompt_cache"]["recent"]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def srv(ckpt, tmp_path_factory):
    server = start_server(ckpt, batch=8)
    adapter = write_lora_adapter(ckpt, tmp_path_factory.mktemp("explain") / "a", seed=1)
    r = httpx.post(server.v1 + "/adapters", json={"id": "a", "path": str(adapter)}, timeout=60)
    assert r.status_code == 200, r.text
    yield server
    server.stop()
    close(server.engine)


def test_a_repeat_hits_and_says_so_on_every_surface(srv):
    oa = openai.OpenAI(base_url=srv.v1, api_key="x")
    an = anthropic.Anthropic(base_url=srv.base_url, api_key="x")
    messages = [{"role": "user", "content": PREAMBLE + "Which file holds the parser?"}]
    first = oa.chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=2, temperature=0)
    assert fields(first.headers[HEADER])["reason"] == "empty"  # a fresh server
    assert hit(first.headers[HEADER])[0] == 0
    again = oa.chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=2, temperature=0)
    got, total = hit(again.headers[HEADER])
    assert got == total - 1 == again.parse().usage.prompt_tokens - 1
    assert fields(again.headers[HEADER])["reason"] in ("exact", "within")
    # a stream's headers go out before its body, and already say so
    with oa.chat.completions.with_streaming_response.create(
            model="m", messages=messages, max_tokens=2, temperature=0, stream=True) as s:
        assert hit(s.headers[HEADER]) == (got, total)
        assert any(line.startswith("data:") for line in s.iter_lines())
    with an.messages.with_streaming_response.create(
            model="m", messages=messages, max_tokens=2, stream=True) as s:
        assert hit(s.headers[HEADER])[0] > 0
        assert any("message_stop" in line for line in s.iter_lines())
    raw = an.messages.with_raw_response.create(model="m", messages=messages, max_tokens=2)
    assert hit(raw.headers[HEADER])[0] == raw.parse().usage.cache_read_input_tokens
    resp = oa.responses.with_raw_response.create(model="m", input=messages, max_output_tokens=2)
    assert hit(resp.headers[HEADER])[0] > 0
    text = PREAMBLE + "Which file holds the parser?"
    assert hit(complete(srv, text))[1] == len(tokens(srv, text))


def test_a_changed_token_reports_where_and_the_text_on_both_sides(srv):
    before = PREAMBLE + "The time is 10:41:07. What changed since then?"
    after = PREAMBLE + "The time is 10:42:13. What changed since then?"
    a, b = tokens(srv, before), tokens(srv, after)
    k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert k >= 64  # the preamble is long enough for a hit up to the change
    complete(srv, before)
    value = complete(srv, after)
    assert fields(value)["reason"] == "diverged"
    assert int(fields(value)["at"]) == k and hit(value) == (k, len(b))
    row = recent(srv)[-1]
    assert row["header"] == value and row["at"] == k
    text = row["text"]
    assert "2:13" in text["prompt"] and "1:07" in text["cached"]
    assert text["before"].strip() and text["before"].strip() in before  # what both share

    # a change near the start leaves too little to reuse: a miss, and why
    early = "Time 09:00:00. " + PREAMBLE + "What changed since then?"
    complete(srv, early)
    value = complete(srv, "Time 09:30:00. " + PREAMBLE + "What changed since then?")
    f = fields(value)
    assert f["reason"] == "diverged" and f["note"] == "below-min" and hit(value)[0] == 0
    assert 0 < int(f["at"]) < 64
    assert "3" in recent(srv)[-1]["text"]["prompt"]


def test_another_adapter_reports_the_other_namespace(srv):
    prompt = "Adapters only. " + PREAMBLE + "List the adapters you know about."
    assert fields(complete(srv, prompt, adapter="a"))["reason"] == "empty"  # a new namespace
    value = complete(srv, prompt)  # the base model: its own namespace has no such entry
    f = fields(value)
    assert f["reason"] == "namespace" and f["ns"] == "adapter", value
    assert int(f["at"]) == len(tokens(srv, prompt)) and hit(value)[0] == 0
    assert recent(srv)[-1]["namespace"] == ["adapter"]
    # and the other way round: the adapter's own entry now serves it
    assert hit(complete(srv, prompt, adapter="a"))[0] == len(tokens(srv, prompt)) - 1


def test_the_cli_prints_the_last_requests(srv, capsys):
    complete(srv, PREAMBLE + "The build number is 4411, go on.")
    complete(srv, PREAMBLE + "The build number is 4598, go on.")
    assert cli.main(["cache", "explain", "-n", "2", "--url", srv.v1]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("prefix cache: ") and "hits of" in lines[0]
    assert "diverged" in out and "at token" in out
    assert any(line.strip().startswith("cached:") and "4" in line for line in lines)
    assert cli.main(["cache", "explain", "-n", "3", "--json", "--url", srv.base_url]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3 and rows[-1]["reason"] == "diverged"


def test_the_cli_says_when_no_server_answers(capsys):
    assert cli.main(["cache", "explain", "--url", "http://127.0.0.1:9"]) == 1
    assert "no prefix-cache report" in capsys.readouterr().err


def test_an_entry_evicted_under_the_byte_cap_reports_its_eviction(ckpt):
    server = start_server(ckpt, batch=8)
    try:
        first = PREAMBLE + "First task: rename the module."
        complete(server, first)
        settled(server.engine)  # its entry is stored once the answer is out
        one = server.engine.prefix.stats()["bytes"]
        assert one > 0
        server.engine.prefix.max_bytes = one + one // 2  # room for one entry, not two
        complete(server, "A different opening entirely. " + PREAMBLE)  # evicts the first
        settled(server.engine)
        value = complete(server, first)
        f = fields(value)
        assert f["reason"] == "evicted" and f["by"] == "lru", value
        assert int(f["at"]) == len(tokens(server, first)) and hit(value)[0] == 0
        assert f["age"].endswith("s")
        stats = httpx.get(server.base_url + "/stats", timeout=30).json()["prompt_cache"]
        assert stats["evicted"]["lru"] >= 1 and stats["recent"][-1]["by"] == "lru"
    finally:
        server.stop()
        close(server.engine)


def test_the_serial_lane_explains_too(ckpt):
    server = start_server(ckpt, batch=1)
    try:
        before = PREAMBLE + "Step 1 of 9 is done."
        after = PREAMBLE + "Step 2 of 9 is done."
        a, b = tokens(server, before), tokens(server, after)
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        complete(server, before)
        with httpx.stream("POST", server.v1 + "/completions", timeout=120, json={
                "prompt": after, "max_tokens": 2, "stream": True}) as r:
            value = r.headers[HEADER]
            assert any(line.startswith("data:") for line in r.iter_lines())
        assert fields(value)["reason"] == "diverged" and fields(value)["at"] == str(k)
        row = recent(server)[-1]
        assert row["lane"] == "serial" and "2" in row["text"]["prompt"]
    finally:
        server.stop()
        close(server.engine)


def test_an_entry_restored_from_the_ssd_tier_says_so(ckpt, tmp_path):
    import asyncio

    from mlxbun_core.kvstore import durability
    from mlxbun_core.kvstore.config import SsdConfig

    server = start_server(ckpt, batch=8, ssd=SsdConfig(dir=tmp_path / "ssd", demote_idle_s=0))
    try:
        prompt = PREAMBLE + "Put this on the disk."
        complete(server, prompt)
        assert asyncio.run(durability.demote(server.engine, 60)) == 1  # out of RAM, on disk
        value = complete(server, prompt)
        assert fields(value)["reason"] == "ssd" and hit(value)[0] > 64, value
        stats = httpx.get(server.base_url + "/stats", timeout=30).json()["prompt_cache"]
        assert stats["ssd_hits"] == 1 and stats["evicted"] == {"demoted": 1}
    finally:
        server.stop()
        close(server.engine)
