"""Prompt caching clients can rely on: Anthropic ``cache_control`` breakpoints and
OpenAI's ``prompt_cache_key`` pin prefixes in the prefix cache for their TTL, ahead of
LRU eviction; Anthropic usage reports reads and writes by the breakpoints; count_tokens
counts what the engine prefills. Through the official SDKs against a real server."""

from __future__ import annotations

import time

import anthropic
import mlx.core as mx
import openai
import pytest
from mlx_lm.models.cache import KVCache

from mlxbun_core.engine.cache_pins import Pins
from mlxbun_core.engine.prompt_cache import PrefixCache
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import settled
from mlxbun_core.testing.server import start_server

EPHEMERAL = {"type": "ephemeral"}


def _entry(n):
    c = KVCache()
    c.update_and_fetch(mx.zeros((1, 2, n, 8)), mx.zeros((1, 2, n, 8)))
    return [c]


def test_a_pinned_entry_is_evicted_last_and_only_while_its_ttl_lasts():
    now = [0.0]
    one = _exact(4)[0].nbytes  # 4 positions, as stored (a cache is cut to what it holds)
    cache = PrefixCache(max_bytes=2 * one)
    cache.pins.clock = lambda: now[0]
    cache.pins.pin("ns", [1, 2, 3, 4], ttl=300)
    cache.store("ns", [1, 2, 3, 4], _entry(4))
    for start in (10, 20, 30):  # LRU pressure: each store evicts the oldest unpinned
        cache.store("ns", [start + i for i in range(4)], _entry(4))
    assert cache.holds("ns", [1, 2, 3, 4]) and not cache.holds("ns", [20, 21, 22, 23])
    now[0] = 301.0  # the pin expired: an ordinary entry, the oldest, goes first
    cache.store("ns", [40, 41, 42, 43], _entry(4))
    assert not cache.holds("ns", [1, 2, 3, 4]) and cache.holds("ns", [30, 31, 32, 33])


def test_a_pin_within_a_stored_prompt_is_cut_out_as_its_own_entry():
    cache = PrefixCache(max_bytes=1 << 30)
    cache.pins.pin("ns", list(range(1, 6)), ttl=60)
    cache.store("ns", list(range(1, 13)), _entry(12))
    assert cache.holds("ns", list(range(1, 6))) and cache.holds("ns", list(range(1, 13)))
    assert cache.lookup("ns", list(range(1, 6)) + [99])[1] == 5


def test_idle_demotion_writes_a_pinned_entry_to_disk_but_keeps_it_in_ram(tmp_path):
    """Idle demotion frees RAM nobody asked to keep; a live pin asked (RAM pressure
    alone may spill it, through the byte cap)."""
    from mlxbun_core.kvstore.config import SsdConfig
    from mlxbun_core.kvstore.store import SsdStore

    store = SsdStore(SsdConfig(dir=tmp_path / "ssd", demote_idle_s=0, write_behind=False),
                     "fp", namespace_parts=lambda ns: [ns])
    cache = PrefixCache(1 << 30, tier=store)
    cache.pins.pin("ns", [1, 2, 3, 4], ttl=300)
    cache.store("ns", [1, 2, 3, 4], _entry(4))
    cache.store("ns", [5, 6, 7, 8], _entry(4))
    cache.demote_idle()
    assert store.flush(10)
    cache.demote_idle()  # (the second sweep frees what the first wrote)
    assert cache.holds("ns", [1, 2, 3, 4]) and not cache.holds("ns", [5, 6, 7, 8])
    assert store.stats()["entries"] == 2  # both on disk
    cache.pins.clock = lambda: time.monotonic() + 301  # the pin expired: demoted like any
    cache.demote_idle()
    assert not cache.holds("ns", [1, 2, 3, 4])


@pytest.fixture(scope="module")
def server():
    s = start_server(tiny_checkpoint("qwen3"))
    yield s
    s.stop()


def _settled(server) -> None:
    settled(server.engine)


@pytest.fixture
def client(server):
    def reset():
        prefix = server.engine.prefix
        prefix.clear()
        prefix.pins = Pins()
        prefix.max_bytes = 1 << 30

    server.engine.worker.run_sync(reset, timeout=60)  # (after the last test's stores)
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


def _text(text, mark=None):
    block = {"type": "text", "text": text}
    return {**block, "cache_control": mark} if mark else block


def _body(marks: int, tag: str = "") -> dict:
    """A request with ``marks`` breakpoints (tools, system, two user blocks)."""
    tools = [{"name": "read", "description": f"Reads a file {tag}. " * 6,
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    if marks >= 1:
        tools[0]["cache_control"] = EPHEMERAL
    system = [_text(f"You are terse {tag}. " * 20, EPHEMERAL if marks >= 2 else None)]
    content = [_text("Here is the file. " * 10, EPHEMERAL if marks >= 3 else None),
               _text("And here is more. " * 10, {**EPHEMERAL, "ttl": "1h"} if marks >= 4 else None),
               _text("What now?")]
    return {"model": "m", "max_tokens": 3, "tools": tools, "system": system,
            "messages": [{"role": "user", "content": content}]}


@pytest.mark.parametrize("marks", [1, 2, 3, 4])
def test_usage_reports_writes_then_reads_by_the_breakpoints(client, marks):
    body = _body(marks)
    first = client.messages.create(**body).usage
    total = client.messages.count_tokens(**{k: v for k, v in body.items()
                                            if k != "max_tokens"}).input_tokens
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 0
    assert first.input_tokens + first.cache_creation_input_tokens == total
    assert first.input_tokens > 0
    if marks == 4:  # the last breakpoint is the last block but one
        assert first.input_tokens < 20  # "What now?" and the turn's framing
    second = client.messages.create(**body).usage
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens == 0
    assert second.input_tokens == first.input_tokens
    with client.messages.stream(**body) as stream:  # the same in message_start and _delta
        start = next(ev for ev in stream if ev.type == "message_start").message.usage
        final = stream.get_final_message().usage
    assert start.cache_read_input_tokens == final.cache_read_input_tokens == \
        first.cache_creation_input_tokens
    assert start.input_tokens == final.input_tokens == first.input_tokens


def test_a_fifth_breakpoint_is_a_400(client):
    body = _body(4)
    body["messages"][0]["content"][2]["cache_control"] = EPHEMERAL
    body["system"].append(_text("More.", EPHEMERAL))
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(**body)
    assert "maximum of 4 blocks with cache_control" in err.value.message
    bad = _body(1)
    bad["tools"][0]["cache_control"] = {"type": "ephemeral", "ttl": "2h"}
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(**bad)
    assert client.messages.create(**_body(1)).usage.cache_creation_input_tokens > 0


def _pressure(client, server, tag: str) -> None:
    """Unpinned prompts until the cache has evicted at least one entry."""
    before = sum(server.engine.prefix.stats()["evicted"].values())
    for i in range(6):
        client.messages.create(**_body(0, f"{tag}{i}"))
        _settled(server)
        if i >= 2 and sum(server.engine.prefix.stats()["evicted"].values()) > before + 2:
            break
    assert sum(server.engine.prefix.stats()["evicted"].values()) > before


def _cap_to_hold(server, entries: int) -> None:
    """A byte cap that holds about ``entries`` entries of the size stored so far."""
    _settled(server)
    stats = server.engine.prefix.stats()
    server.engine.prefix.max_bytes = entries * stats["bytes"] // max(1, stats["entries"])


def test_a_pinned_prefix_survives_lru_pressure_until_its_ttl(client, server):
    body = _body(2, "pinned")
    client.messages.create(**body)
    _cap_to_hold(server, 4)
    _pressure(client, server, "a")
    assert client.messages.create(**body).usage.cache_read_input_tokens > 0

    unpinned = _body(0, "plain")
    client.messages.create(**unpinned)
    _pressure(client, server, "b")
    assert (client.messages.create(**unpinned).usage.cache_read_input_tokens or 0) == 0

    assert server.engine.prefix.stats()["pinned"] == 2
    server.engine.prefix.pins.clock = lambda: time.monotonic() + 301  # five minutes on
    try:  # (what an expired pin's entry then meets: the unit test above)
        assert server.engine.prefix.stats()["pinned"] == 0
    finally:
        server.engine.prefix.pins.clock = time.monotonic


def test_prompt_cache_key_pins_the_prompt_through_openai(client, server):
    oa = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    msgs = [{"role": "system", "content": "You keep notes. " * 30},
            {"role": "user", "content": "Note one. " * 10}]
    first = oa.chat.completions.create(model="m", messages=msgs, max_tokens=3,
                                       prompt_cache_key="agent-7")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    _cap_to_hold(server, 4)
    _pressure(client, server, "k")
    again = oa.chat.completions.create(model="m", messages=msgs, max_tokens=3,
                                       prompt_cache_key="agent-7")
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    resp = oa.responses.create(model="m", instructions=msgs[0]["content"],
                               input=msgs[1]["content"], max_output_tokens=3,
                               prompt_cache_key="agent-7")
    assert resp.usage.input_tokens_details.cached_tokens > 0


COUNT_BODIES = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"system": [_text("Be brief. "), _text("Use tools.", EPHEMERAL)],
     "tools": _body(1)["tools"], "messages": [{"role": "user", "content": "read a.txt"}]},
    {"system": "You help.", "tools": _body(0)["tools"], "messages": [
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read",
                                           "input": {"path": "a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "hello world"}, _text("and now?")]}]},
]


@pytest.mark.parametrize("body", COUNT_BODIES, ids=["plain", "tools-system", "tool-turn"])
def test_count_tokens_counts_what_the_engine_prefills(client, server, body):
    counted = client.messages.count_tokens(model="m", **body).input_tokens
    prompts = []
    pins = server.engine.prefix.pins
    real = pins.pin_request  # sees the engine's own prompt, as the lane will prefill it

    def spy(namespace, prompt, wanted):
        prompts.append(len(prompt))
        return real(namespace, prompt, wanted)

    pins.pin_request = spy
    try:
        client.messages.create(model="m", max_tokens=2, **body)
    finally:
        del pins.pin_request
    assert prompts == [counted]


def test_a_rolling_breakpoint_reads_the_last_turns_prefix(client):
    """Claude Code marks the system prompt and each turn's last message: the next turn's
    breakpoint is new, but the prefix up to the last one is read from the cache (as
    Anthropic's lookback over earlier block boundaries reads it)."""
    system = [_text("You are terse. " * 20, EPHEMERAL)]
    turns = [{"role": "user", "content": [_text("Here is the file. " * 10, EPHEMERAL)]}]
    first = client.messages.create(model="m", max_tokens=3, system=system, messages=turns)
    turns[0]["content"][0].pop("cache_control")
    turns += [{"role": "assistant", "content": "Noted."},
              {"role": "user", "content": [_text("Now the next one. " * 5, EPHEMERAL)]}]
    second = client.messages.create(model="m", max_tokens=3, system=system, messages=turns)
    written = first.usage.cache_creation_input_tokens
    assert second.usage.cache_read_input_tokens >= written > 0
    total = client.messages.count_tokens(model="m", system=system, messages=turns).input_tokens
    u = second.usage
    assert u.cache_read_input_tokens + u.cache_creation_input_tokens + u.input_tokens == total


def _exact(n):
    c = KVCache()
    c.keys, c.values, c.offset = mx.zeros((1, 2, n, 8)), mx.zeros((1, 2, n, 8)), n
    return [c]


def test_rolling_pins_past_the_cap_keep_the_longest_prefix_that_fits():
    """Each turn pins a longer prefix of one conversation (and the system prompt stays
    pinned): the shorter pinned entries, served by the longest, go first; once the
    longest outgrows the cap, the longest pin that fits is cut from it, not nothing."""
    per_token = _exact(1)[0].nbytes
    cache = PrefixCache(max_bytes=250 * per_token)
    turns = [list(range(1, n + 1)) for n in (100, 150, 200, 300)]  # system, three turns
    for t in turns:
        cache.pins.pin("ns", t, ttl=300)
    for t in turns[1:]:
        cache.store("ns", t, _exact(len(t)))
        assert cache.stats()["bytes"] <= cache.max_bytes
    assert [len(t) for _, t, _ in cache.entries()] == [200]
    assert cache.lookup("ns", turns[2] + [999])[1] == 200
    assert cache.lookup("ns", turns[0] + [999])[1] == 100
