"""POST /v1/responses through the official openai SDK against a real server,
plus the response store on its own.

The model is a tiny random checkpoint whose logits follow a script
(tests/scripted_model.py), so the whole real path runs and output is exact.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from mlxbun_core.server.openai.response_store import ResponseStore
from scripted_model import scripted_fixtures

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


server, srv, plugin = scripted_fixtures("Hello there!", "scripted-responses")


@pytest.fixture
def client(srv):
    return openai.OpenAI(base_url=srv.v1, api_key="test", max_retries=0)


def sse(srv, body) -> list[dict]:
    """Raw event payloads of a streamed /v1/responses call (event name checked)."""
    with httpx.stream("POST", srv.v1 + "/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    out = []
    for frame in raw.strip().split("\n\n"):
        if frame.startswith(":"):
            continue  # keep-alive comment
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        out.append(data)
    return out


def assert_error(r, status, kind, fragment="", param=None):
    """The Responses error shape; ``kind`` is invalid_request_error or server_error only."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == kind and err["type"] in ("invalid_request_error", "server_error")
    if param is not None:
        assert err["param"] == param
    assert fragment in err["message"]


def post(srv, body):
    return httpx.post(srv.v1 + "/responses", json=body)


# ------------------------------------------------------------------ happy paths

def test_create_text(client, srv):
    r = client.responses.create(model="any", input="Say hello", instructions="Be brief.",
                                temperature=0.5, top_p=0.9, max_output_tokens=32,
                                extra_body={"top_k": 20, "min_p": 0.05, "logit_bias": {"7": -1}})
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == srv.engine.model.id
    assert [o.type for o in r.output] == ["message"]
    msg = r.output[0]
    assert msg.role == "assistant" and msg.status == "completed"
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert r.output_text == "Hello there!"
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens == 0
    assert u.output_tokens_details.reasoning_tokens == 0


def test_items_input_and_reasoning_item(client, plugin):
    plugin.text = "<think>Think first.</think>Answer."
    r = client.responses.create(model="any", input=[
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello"}]},
        {"role": "user", "content": "Again"}], reasoning={"effort": "low"})
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].summary[0].type == "summary_text"
    assert r.output[0].summary[0].text == "Think first."
    assert r.output_text == "Answer."
    assert r.usage.output_tokens_details.reasoning_tokens > 0


def test_incomplete_on_max_output_tokens(client, plugin):
    plugin.text = "one two three four five six seven eight"
    r = client.responses.create(model="any", input="count", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_tool_round_trip_with_resumption(client, plugin, srv):
    plugin.text = CALL
    first = client.responses.create(
        model="any", input="Weather in Paris?", instructions="Use tools.",
        tools=[WEATHER, {"type": "web_search"}], tool_choice="auto")
    assert [o.type for o in first.output] == ["function_call"]
    call = first.output[0]
    assert call.id.startswith("fc_") and call.status == "completed"
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    plugin.text = "It is sunny."
    second = client.responses.create(
        model="any", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "It is sunny." and second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    # resuming from the second one: instructions carry forward unless replaced
    carried = client.responses.create(model="any", previous_response_id=second.id, input="ok")
    replaced = client.responses.create(model="any", previous_response_id=second.id, input="ok",
                                       instructions="")
    assert carried.usage.input_tokens > replaced.usage.input_tokens
    # the whole conversation replayed by hand costs the same as resuming
    manual = client.responses.create(model="any", instructions="Use tools.", tools=[WEATHER],
                                     input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert manual.usage.input_tokens == second.usage.input_tokens
    for choice in ("none", "required", {"type": "function", "name": "get_weather"}):
        client.responses.create(model="any", input="x", tools=[WEATHER], tool_choice=choice,
                                max_output_tokens=4)


def test_stats_and_store_false(client, srv):
    before = httpx.get(srv.base_url + "/stats").json()["response_store"]
    assert before["max_bytes"] == 32 * 1024 * 1024 and before["ttl_ms"] == 3600 * 1000
    client.responses.create(model="any", input="hi", store=False)
    assert httpx.get(srv.base_url + "/stats").json()["response_store"] == before
    client.responses.create(model="any", input="hi")
    after = httpx.get(srv.base_url + "/stats").json()["response_store"]
    assert after["entries"] == before["entries"] + 1 and after["bytes"] > before["bytes"]


def test_retrieve_and_delete_stored_response(client, plugin):
    plugin.text = "Stored answer."
    created = client.responses.create(model="any", input="hi")
    got = client.responses.retrieve(created.id)
    assert got.id == created.id and got.output_text == "Stored answer."
    assert got.usage.output_tokens == created.usage.output_tokens
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="any", input="again", previous_response_id=created.id)


def test_sdk_stream_text(client, plugin):
    plugin.text = "<think>hmm</think>Hello, stream!"
    deltas = []
    with client.responses.stream(model="any", input="hi") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == "Hello, stream!" == final.output_text
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].summary[0].text == "hmm"
    assert final.status == "completed" and final.usage.output_tokens > 0


def test_sdk_stream_tool_call_then_resume(client, plugin):
    plugin.text = "Checking." + CALL
    args = []
    with client.responses.stream(model="any", input="Weather?", tools=[WEATHER]) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.done":
                args.append(event.arguments)
        final = stream.get_final_response()
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output_text == "Checking."
    call = final.output[1]
    assert json.loads(call.arguments) == {"city": "Paris"} and args == [call.arguments]
    plugin.text = "Sunny."
    with client.responses.stream(model="any", previous_response_id=final.id, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]) as s:
        assert s.get_final_response().output_text == "Sunny."


def test_raw_event_chain(srv, plugin):
    plugin.text = "<think>hmm</think>Hi!" + CALL
    events = sse(srv, {"input": "hi", "tools": [WEATHER]})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    runs = [k for i, k in enumerate(kinds) if not (k.endswith(".delta") and kinds[i - 1] == k)]
    assert runs == [  # consecutive deltas collapsed to one
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    rid = events[0]["response"]["id"]
    assert all(e["response"]["id"] == rid for e in events if "response" in e)
    assert events[0]["response"]["status"] == "in_progress"
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert [o["type"] for o in done["output"]] == ["reasoning", "message", "function_call"]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [a["id"] for a in added] == [o["id"] for o in done["output"]]
    done_items = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in done_items] == [0, 1, 2]


def test_raw_incomplete_and_failed(srv, plugin):
    plugin.text = "one two three four five six seven eight"
    events = sse(srv, {"input": "count", "max_output_tokens": 3})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    plugin.fail_at = 3
    events = sse(srv, {"input": "count"})
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert "scripted forward failure" in events[-1]["response"]["error"]["message"]
    assert_error(post(srv, {"input": "count"}), 500, "server_error", "scripted forward failure")


# ------------------------------------------------------------------ errors

def test_unknown_previous_response_id(client, srv):
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="any", input="hi", previous_response_id="resp_nope")
    assert err.value.body["type"] == "invalid_request_error"  # the spec has no not_found type
    assert_error(post(srv, {"input": "hi", "previous_response_id": "resp_nope"}), 404,
                 "invalid_request_error", "resp_nope", param="previous_response_id")
    for method in (httpx.get, httpx.delete):
        assert_error(method(srv.v1 + "/responses/resp_nope"), 404, "invalid_request_error",
                     "resp_nope")
    # a wrongly typed id is a bad request, not an unknown one
    assert_error(post(srv, {"input": "hi", "previous_response_id": 5}), 400,
                 "invalid_request_error", "previous_response_id must be a string",
                 param="previous_response_id")


@pytest.mark.parametrize("extra,fragment,param", [
    ({"max_output_tokens": "x"}, "max_output_tokens must be of type int", "max_output_tokens"),
    ({"max_output_tokens": 0}, "max_output_tokens must be at least 1", "max_output_tokens"),
    ({"max_tokens": "x"}, "max_tokens must be of type int", "max_tokens"),  # the name sent
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort must be one of", "reasoning.effort"),
    ({"text": {"format": {"type": "json_schema", "name": "o", "schema": "x"}}},
     "text.format.schema must be a JSON schema object", "text.format.schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type must be one of",
     "text.format.type"),
    ({"text": "x"}, "text must be an object", "text"),
    ({"reasoning": "high"}, "reasoning must be an object", "reasoning"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
     "input_text text must be a string", "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": 5, "arguments": "{}"}]},
     "function_call name must be a string", "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
     "function_call arguments must be a string", "input"),
    ({"tools": [{**WEATHER, "parameters": "x"}]}, "tools[0].parameters must be a JSON schema",
     "tools"),
    ({"tools": [{**WEATHER, "name": 5}]}, "tools[0].name must be a non-empty string", "tools"),
    ({"tools": [5]}, "tools[0] must be an object", "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice must be", "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": 5}},
     "tool_choice.name must be a string", "tool_choice"),
    ({"stream": "yes"}, "stream must be of type bool", "stream"),
    ({"store": 1}, "store must be a boolean", "store"),
])
def test_wrongly_typed_fields_name_the_field_sent(srv, extra, fragment, param):
    assert_error(post(srv, {"input": "hi", **extra}), 400, "invalid_request_error", fragment,
                 param=param)


def test_whitespace_before_tool_call_is_not_a_message(client, plugin, srv):
    """The tool parser drops whitespace around parsed markup: no empty message item."""
    plugin.text = "\n\n" + CALL
    r = client.responses.create(model="any", input="Weather?", tools=[WEATHER])
    assert [o.type for o in r.output] == ["function_call"]
    events = sse(srv, {"input": "Weather?", "tools": [WEATHER]})
    assert not any(e["type"].startswith("response.output_text") for e in events)
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["function_call"]
    plugin.text = "\n\n"  # whitespace alone (no call) is still the answer
    events = sse(srv, {"input": "Weather?", "tools": [WEATHER]})
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "\n\n"


def test_bad_requests(srv, client):
    r = httpx.post(srv.v1 + "/responses", content=b"[oops",
                   headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_request_error", "invalid JSON")
    assert_error(post(srv, {"input": 42}), 400, "invalid_request_error", "input")
    assert_error(post(srv, {}), 400, "invalid_request_error", "input")
    assert_error(post(srv, {"input": [{"type": "mystery"}]}), 400, "invalid_request_error",
                 "mystery")
    assert_error(post(srv, {"input": [{"role": "tool", "content": "x"}]}), 400,
                 "invalid_request_error", "role")
    assert_error(post(srv, {"input": "hi", "temperature": -1}), 400, "invalid_request_error",
                 "temperature")
    assert_error(post(srv, {"input": "hi", "max_output_tokens": 0}), 400,
                 "invalid_request_error")
    assert_error(post(srv, {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}), 400,
        "invalid_request_error", srv.engine.model.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="any", input=[{"type": "mystery"}])  # type: ignore[list-item]


# ------------------------------------------------------------------ the store alone

def test_store_ttl_lru_and_byte_cap():
    clock = [0.0]
    store = ResponseStore(max_bytes=100, ttl_s=10, clock=lambda: clock[0])
    assert store.put("a", "x" * 30) and store.put("b", "y" * 30)
    assert store.stats() == {"entries": 2, "bytes": 64, "max_bytes": 100, "ttl_ms": 10000}
    assert store.get("a") == "x" * 30  # a is now most recently used
    assert store.put("c", "z" * 30)  # 96 bytes: fits
    assert store.put("d", "w" * 10)  # over the cap: b (least recent) goes
    assert store.get("b") is None and store.get("a") is not None
    assert not store.put("huge", "h" * 200) and store.get("huge") is None
    assert store.put("é", "é" * 20)  # bytes, not characters
    assert store.stats()["bytes"] <= 100
    clock[0] = 11.0
    assert store.get("a") is None and store.stats()["entries"] == 0


# ------------------------------------------------------------------ one real model

def test_real_model_answers(smollm2_server):
    """SmolLM2 (real weights) through responses.create: real text, real structure."""
    client = openai.OpenAI(base_url=smollm2_server.v1, api_key="test", max_retries=0)
    r = client.responses.create(model="any", input="What is the capital of France?",
                                max_output_tokens=8, temperature=0)
    assert r.output_text.strip() and r.status in ("completed", "incomplete")
    assert r.usage.output_tokens <= 8
