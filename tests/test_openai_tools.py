"""Tool calls on the OpenAI chat surface, with a scripted model so the markup is exact
and everything else (template, sampler, detokenizer, parser, SSE) runs for real."""

import json

import httpx
import openai
import pytest

from scripted_model import scripted_server

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "zip": {"type": "string"}}}}}]
CALL = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, '
        '"zip": "007"}}</tool_call>')


@pytest.fixture(scope="module")
def scripted():
    with scripted_server("Checking. " + CALL, name="scripted-openai-tools") as (srv, plugin):
        yield srv, plugin


def ask(client, **kw):
    return client.chat.completions.create(model="m", tools=TOOLS, max_tokens=300,
                                          messages=[{"role": "user", "content": "Weather?"}], **kw)


def test_tool_call_non_stream(scripted):
    srv, plugin = scripted
    plugin.text = CALL
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    r = ask(client)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3, "zip": "007"}


def test_content_streams_before_markup_then_tool_call_delta(scripted):
    srv, plugin = scripted
    plugin.text = "Checking. " + CALL
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    chunks = list(ask(client, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content.strip() == "Checking."
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    # the head (index, id, name, no arguments yet), then the arguments in pieces
    assert calls[0][0].index == 0 and calls[0][0].function.name == "get_weather"
    assert calls[0][0].function.arguments == "" and len(calls) > 2
    assert all(d[0].index == 0 and d[0].function.name is None for d in calls[1:])
    args = "".join(d[0].function.arguments for d in calls)
    assert json.loads(args) == {"city": "Paris", "days": 3, "zip": "007"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_leaves_markup_as_text(scripted):
    srv, plugin = scripted
    plugin.text = CALL
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    r = ask(client, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content


def test_keepalive_comments_while_large_tool_body_streams(scripted):
    srv, plugin = scripted
    plugin.text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "'
                   + "Paris " * 200 + '"}}</tool_call>')
    with httpx.stream("POST", srv.v1 + "/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
            "max_tokens": 2000, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert ": keep-alive" in lines  # still sent while a long call is written
    first_call = next(i for i, line in enumerate(lines) if '"tool_calls"' in line)
    assert first_call < lines.index(": keep-alive") and lines[-1] == "data: [DONE]"


def test_tool_round_trip(scripted):
    srv, plugin = scripted
    plugin.text = CALL
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    first = ask(client)
    call = first.choices[0].message.tool_calls[0]
    plugin.text = "It is sunny."
    r = client.chat.completions.create(model="m", tools=TOOLS, max_tokens=50, messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}])
    assert r.choices[0].message.content == "It is sunny." and r.choices[0].finish_reason == "stop"
