"""POST /v1/messages through the official anthropic SDK against a real server.

The model is a tiny random checkpoint whose logits follow a script
(tests/scripted_model.py), so the whole real path runs and output is exact.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from scripted_model import scripted_fixtures

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


server, srv, plugin = scripted_fixtures("Hello there!", "scripted-anthropic")


@pytest.fixture
def client(srv):
    return anthropic.Anthropic(base_url=srv.base_url, api_key="test", max_retries=0)


def sse(srv, body) -> list[tuple[str, dict]]:
    """Raw (event, data) pairs of a streamed /v1/messages call."""
    with httpx.stream("POST", srv.v1 + "/messages", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    out = []
    for frame in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def post(srv, body, path="/messages"):
    return httpx.post(srv.v1 + path, json=body)


def assert_error(r, status, kind, fragment=""):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert fragment in body["error"]["message"]


# ------------------------------------------------------------------ happy paths

def test_create_text(client, srv):
    msg = client.messages.create(model="any", max_tokens=32, messages=USER)
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == srv.engine.model.id
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "Hello there!"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    assert msg.usage.cache_read_input_tokens is None  # nothing came from the prompt cache


def test_system_blocks_sampling_and_extras(client):
    msg = client.messages.create(
        model="any", max_tokens=32, messages=USER,
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Be kind."}],
        extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
                    "repetition_penalty": 1.1, "xtc_probability": 0.0})
    assert msg.content[0].text == "Hello there!"


def test_thinking_block(client, plugin):
    plugin.text = "<think>Plan the greeting.</think>Hello!"
    msg = client.messages.create(model="any", max_tokens=32, messages=USER)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "Plan the greeting."
    assert msg.content[1].text == "Hello!"


def test_max_tokens_and_stop_sequence(client, plugin):
    plugin.text = "one two three four five six seven eight nine ten"
    msg = client.messages.create(model="any", max_tokens=2, messages=USER)
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 2
    msg = client.messages.create(model="any", max_tokens=64, messages=USER,
                                 stop_sequences=["four"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "four"
    assert msg.content[0].text == "one two three "


def test_tool_round_trip(client, plugin):
    plugin.text = "Let me check." + CALL
    msg = client.messages.create(model="any", max_tokens=64, messages=USER,
                                 tools=[WEATHER,
                                        {"type": "web_search_20250305", "name": "web_search"}],
                                 tool_choice={"type": "auto"})
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    use = msg.content[1]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id
    plugin.text = "It is sunny in Paris."
    follow = USER + [
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id,
             "content": [{"type": "text", "text": "sunny, 24C"}]},
            {"type": "text", "text": "Thanks"}]}]
    final = client.messages.create(model="any", max_tokens=64, messages=follow, tools=[WEATHER])
    assert final.content[0].text == "It is sunny in Paris." and final.stop_reason == "end_turn"
    def prompt(u):  # input_tokens leaves out what the prefix cache served
        return u.input_tokens + (u.cache_read_input_tokens or 0)
    assert prompt(final.usage) > prompt(msg.usage)
    # string tool_result content and tool_choice any/tool/none are accepted too
    follow[-1]["content"][0] = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny",
                                "is_error": False}
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}, {"type": "none"}):
        client.messages.create(model="any", max_tokens=8, messages=follow, tools=[WEATHER],
                               tool_choice=choice)


def test_stream_text_and_final_message(client, plugin):
    plugin.text = "<think>hmm</think>Hello, streaming world!"
    with client.messages.stream(model="any", max_tokens=64, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello, streaming world!"
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "hmm"
    assert final.content[1].text == text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_stream_tool_use(client, plugin):
    plugin.text = CALL
    with client.messages.stream(model="any", max_tokens=64, messages=USER,
                                tools=[WEATHER]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == {"city": "Paris"}


def test_raw_event_grammar(srv, plugin):
    plugin.text = "<think>hmm</think>Hi!" + CALL
    events = sse(srv, {"model": "x", "max_tokens": 64, "messages": USER, "tools": [WEATHER]})
    names = [e for e, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0
    blocks = [d["content_block"]["type"] for e, d in events if e == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use"]
    # each block: start, deltas, stop, with matching indexes and no interleaving
    body = names[1:-2]
    i = 0
    for index in range(3):
        assert body[i] == "content_block_start" and events[1 + i][1]["index"] == index
        i += 1
        while body[i] == "content_block_delta":
            assert events[1 + i][1]["index"] == index
            i += 1
        assert body[i] == "content_block_stop" and events[1 + i][1]["index"] == index
        i += 1
    assert i == len(body)
    deltas = [d["delta"]["type"] for e, d in events if e == "content_block_delta"]
    assert set(deltas) == {"thinking_delta", "text_delta", "input_json_delta"}
    partial = "".join(d["delta"]["partial_json"] for e, d in events
                      if e == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"]["output_tokens"] > 0


def test_keepalive_ping_while_tool_markup_buffers(srv, plugin):
    long = "x" * 600
    plugin.text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
                   % long)
    events = sse(srv, {"model": "x", "max_tokens": 400, "messages": USER, "tools": [WEATHER]})
    assert ("ping", {"type": "ping"}) in events
    assert events[-1][0] == "message_stop"


def test_mid_stream_error_event(srv, plugin):
    plugin.text, plugin.fail_at = "one two three four five six", 3
    events = sse(srv, {"model": "x", "max_tokens": 64, "messages": USER})
    assert events[0][0] == "message_start"
    name, data = events[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error"
    r = post(srv, {"model": "x", "max_tokens": 64, "messages": USER})
    assert_error(r, 500, "api_error", "scripted forward failure")


def test_count_tokens(client):
    small = client.messages.count_tokens(model="any", messages=USER)
    assert small.input_tokens > 0
    bigger = client.messages.count_tokens(model="any", messages=USER, system="You are helpful.")
    assert bigger.input_tokens > small.input_tokens
    # prior-turn thinking blocks are dropped on re-ingest: they cost no tokens
    turn = [{"type": "text", "text": "Hi"}]
    plain = USER + [{"role": "assistant", "content": turn}, {"role": "user", "content": "more"}]
    thought = USER + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "a long private thought " * 10, "signature": "s"},
        {"type": "redacted_thinking", "data": "opaque"}] + turn},
        {"role": "user", "content": "more"}]
    assert (client.messages.count_tokens(model="any", messages=plain).input_tokens
            == client.messages.count_tokens(model="any", messages=thought).input_tokens)


# ------------------------------------------------------------------ errors

def test_error_bad_json(srv):
    r = httpx.post(srv.v1 + "/messages", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_request_error", "invalid JSON")


def test_error_missing_max_tokens(client, srv):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="any", messages=USER, max_tokens=None,  # type: ignore[arg-type]
                               timeout=30)
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert_error(post(srv, {"messages": USER}), 400, "invalid_request_error", "max_tokens")


def test_error_logit_bias_rejected(srv):
    r = post(srv, {"max_tokens": 8, "messages": USER, "logit_bias": {"5": 10}})
    assert_error(r, 400, "invalid_request_error", "logit_bias")


def test_error_audio_block(srv):
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    r = post(srv, {"max_tokens": 8, "messages": [{"role": "user", "content": [audio]}]})
    assert_error(r, 400, "invalid_request_error", "/v1/chat/completions")


def test_error_image_on_text_model(srv):
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
    r = post(srv, {"max_tokens": 8, "messages": [{"role": "user", "content": [img]}]})
    assert_error(r, 400, "invalid_request_error", srv.engine.model.id)
    url_img = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    r = post(srv, {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [url_img]}]}]})
    assert_error(r, 400, "invalid_request_error", srv.engine.model.id)
    file_img = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    r = post(srv, {"max_tokens": 8, "messages": [{"role": "user", "content": [file_img]}]})
    assert_error(r, 400, "invalid_request_error", "image source")


def test_error_bad_fields(srv):
    assert_error(post(srv, {"max_tokens": 8, "messages": []}), 400, "invalid_request_error")
    assert_error(post(srv, {"max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}),
                 400, "invalid_request_error", "messages[0].role must be one of")
    assert_error(post(srv, {"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}),
                 400, "invalid_request_error", "a user or assistant message")
    assert_error(post(srv, {"max_tokens": 8, "messages": USER, "temperature": "hot"}),
                 400, "invalid_request_error", "temperature")
    assert_error(post(srv, {"max_tokens": 0, "messages": USER}), 400, "invalid_request_error")
    assert_error(post(srv, {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {}}]}]}), 400, "invalid_request_error", "document")
    assert_error(post(srv, {"messages": USER, "logit_bias": {}}, "/messages/count_tokens"),
                 400, "invalid_request_error", "logit_bias")


IMG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}


def user(*blocks):
    return [{"role": "user", "content": list(blocks)}]


@pytest.mark.parametrize("extra,fragment", [
    ({"messages": user({"type": "image", "source": "x"})}, "image source must be an object"),
    ({"messages": user({"type": "image", "source": {"type": "base64", "data": "iVBO",
                                                     "media_type": 5}})},
     "media_type must be a string"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t1",
                        "content": [{"type": "image", "source": 5}]})},
     "image source must be an object"),
    ({"messages": user({"type": "tool_result", "tool_use_id": 5, "content": "x"})},
     "tool_use_id must be a non-empty string"),
    ({"messages": user({"type": "text", "text": 7})}, "text block text must be a string"),
    ({"messages": user({"type": "text"})}, "text block text must be a string"),
    ({"messages": USER + [{"role": "assistant", "content": [{"type": "text", "text": [1]}]}]},
     "text block text must be a string"),
    ({"messages": USER + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": "x"}]}]},
     "tool_use input must be an object"),
    ({"system": [5, {"type": "text", "text": "x"}]}, "system[0] must be a text block"),
    ({"system": [{"type": "text", "text": 7}]}, "system[0].text must be a string"),
    ({"system": 5}, "system must be a string or a list"),
    ({"output_config": {"effort": [1]}}, "output_config.effort must be a non-empty string"),
    ({"output_config": "high"}, "output_config must be an object"),
    ({"output_config": {"format": {"type": "xml"}}}, "output_config.format.type must be"),
    ({"thinking": {"type": "enabled"}, "chat_template_kwargs": 5},
     "chat_template_kwargs must be an object"),
    ({"chat_template_kwargs": 5}, "chat_template_kwargs must be an object"),
    ({"thinking": "on"}, "thinking must be an object"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type must be one of"),
    ({"tools": [{**WEATHER, "name": 5}]}, "tools[0].name must be a non-empty string"),
    ({"tools": [{**WEATHER, "input_schema": "x"}]}, "tools[0].input_schema must be an object"),
    ({"tools": [5]}, "tools[0] must be an object"),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice must be an object"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": 5}},
     "tool_choice.name must be a non-empty string"),
    ({"stream": "yes"}, "stream must be of type bool"),
])
def test_error_wrongly_typed_nested_fields(srv, extra, fragment):
    body = {"max_tokens": 8, "messages": USER, **extra}
    assert_error(post(srv, body), 400, "invalid_request_error", fragment)


@pytest.mark.parametrize("extra,fragment", [
    ({"max_tokens": "8"}, "max_tokens must be of type int"),
    ({"stop_sequences": 5}, "stop_sequences must be a string or a list of strings"),
    ({"output_config": {"effort": "huge"}}, "output_config.effort must be one of"),
    ({"output_config": {"format": {"type": "json_schema", "schema": "x"}}},
     "output_config.format.schema must be a JSON schema object"),
    ({"output_format": {"type": "json_schema", "schema": 5}},
     "output_format.schema must be a JSON schema object"),
])
def test_error_messages_use_anthropic_field_names(srv, extra, fragment):
    assert_error(post(srv, {"max_tokens": 8, "messages": USER, **extra}), 400,
                 "invalid_request_error", fragment)


def test_error_message_carries_param(srv):
    """Anthropic's error has no param field: a known param leads the message (once)."""
    from mlxbun_core.errors import BadRequest
    from mlxbun_core.server.anthropic.messages import anthropic_error

    led = json.loads(anthropic_error(BadRequest("must be positive", param="top_k")).content.body)
    assert led["error"]["message"] == "top_k: must be positive"
    r = post(srv, {"max_tokens": 8, "messages": USER, "temperature": "hot"})
    assert_error(r, 400, "invalid_request_error", "temperature must be")
    assert r.json()["error"]["message"].startswith("temperature must be")


def test_message_start_usage_matches_final_accounting(srv, client):
    body = {"model": "x", "max_tokens": 16, "messages": USER}
    events = sse(srv, body)
    start = events[0][1]["message"]["usage"]
    final = [d for e, d in events if e == "message_delta"][0]["usage"]
    plain = client.messages.create(**body).usage  # the same prompt again: a cache hit
    assert start["output_tokens"] == 0
    assert final["input_tokens"] == start["input_tokens"]
    assert final.get("cache_read_input_tokens") == start.get("cache_read_input_tokens")
    total = start["input_tokens"] + start.get("cache_read_input_tokens", 0)
    assert plain.cache_read_input_tokens > 0
    assert plain.input_tokens + plain.cache_read_input_tokens == total


def test_whitespace_before_tool_call_is_not_a_text_block(client, srv, plugin):
    """The tool parser drops whitespace around parsed markup: no empty text block."""
    plugin.text = "\n\n" + CALL
    msg = client.messages.create(model="any", max_tokens=64, messages=USER, tools=[WEATHER])
    assert [b.type for b in msg.content] == ["tool_use"]
    events = sse(srv, {"model": "x", "max_tokens": 64, "messages": USER, "tools": [WEATHER]})
    blocks = [d["content_block"]["type"] for e, d in events if e == "content_block_start"]
    assert blocks == ["tool_use"]
    plugin.text = "\n\n"  # whitespace alone (no call) is still the answer
    events = sse(srv, {"model": "x", "max_tokens": 64, "messages": USER, "tools": [WEATHER]})
    text = "".join(d["delta"]["text"] for e, d in events
                   if e == "content_block_delta" and d["delta"]["type"] == "text_delta")
    assert text == "\n\n"


def test_count_tokens_compiles_no_grammar(client, srv):
    from mlxbun_core.grammar_registry import registry

    schema = {"type": "object", "properties": {"count_only_field": {"type": "integer"}}}
    plain = client.messages.count_tokens(model="any", messages=USER).input_tokens
    before = registry.stats()["compile_cache"]
    for extra in ({"output_config": {"format": {"type": "json_schema", "schema": schema}}},
                  {"output_format": {"type": "json_schema", "schema": schema}},
                  {"response_format": {"type": "json_schema",
                                       "json_schema": {"name": "o", "schema": schema}}}):
        r = post(srv, {"messages": USER, **extra}, "/messages/count_tokens")
        assert r.status_code == 200 and r.json() == {"input_tokens": plain}
    assert registry.stats()["compile_cache"] == before
    # a malformed format is still a 400, as on /v1/messages
    r = post(srv, {"messages": USER, "output_config": {"format": {"type": "json_schema",
                                                                  "schema": 5}}},
             "/messages/count_tokens")
    assert_error(r, 400, "invalid_request_error", "output_config.format.schema")


# ------------------------------------------------------------------ one real model

def test_real_model_answers(smollm2_server):
    """SmolLM2 (real weights) through messages.stream: real text, real structure."""
    client = anthropic.Anthropic(base_url=smollm2_server.base_url, api_key="test", max_retries=0)
    with client.messages.stream(model="any", max_tokens=8, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content":
                                           "What is the capital of France?"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.content[-1].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens <= 8
