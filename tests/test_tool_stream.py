"""Tool calls that stream as they are written, through each SDK's own stream helper: the
name first, then argument pieces while the model writes them, and the accumulated call
equal (exactly, as JSON text) to the one a non-streamed request returns. A call the
budget cuts is withdrawn, and the last frame of each surface says so. The model is
scripted (tests/scripted_model.py), so the markup is exact and the rest is real."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from scripted_model import scripted_fixtures

TOOL = {"name": "write_file", "description": "Write a file",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"},
            "mode": {"type": "integer"}}, "required": ["path", "content"]}}
OPENAI_TOOLS = [{"type": "function", "function": TOOL}]
ANTHROPIC_TOOLS = [{"name": TOOL["name"], "description": TOOL["description"],
                    "input_schema": TOOL["parameters"]}]
RESPONSES_TOOLS = [dict(TOOL, type="function")]
BODY = "first line\nsecond \"quoted\" — ünïcode\nthird: a tab\tand {braces}, [1, 2]\n"
CALL = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "notes/a.txt", "content": '
        + json.dumps(BODY, ensure_ascii=False) + ', "mode": 420}}\n</tool_call>')
ASK = [{"role": "user", "content": "Write the notes."}]

server, srv, plugin = scripted_fixtures("Writing it. " + CALL, "scripted-tool-stream")


@pytest.fixture
def oai(srv):
    return openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)


@pytest.fixture
def ant(srv):
    return anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)


def whole_arguments(oai) -> str:
    r = oai.chat.completions.create(model="m", messages=ASK, tools=OPENAI_TOOLS, max_tokens=400)
    (call,) = r.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"path": "notes/a.txt", "content": BODY,
                                                   "mode": 420}
    return call.function.arguments


def test_openai_chat_stream_helper_sees_the_arguments_grow(oai):
    whole = whole_arguments(oai)
    pieces, names, opened = [], [], 0
    with oai.chat.completions.stream(model="m", messages=ASK, tools=OPENAI_TOOLS,
                                     max_tokens=400) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                pieces.append(event.arguments_delta)
                opened += event.arguments != ""  # the snapshot so far, while it grows
            elif event.type == "chunk" and event.chunk.choices:
                for d in event.chunk.choices[0].delta.tool_calls or ():
                    if d.function and d.function.name:
                        names.append((d.id, d.type, d.function.name, d.function.arguments))
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert len(names) == 1 and names[0][1:] == ("function", "write_file", "")
    assert names[0][0] == call.id and call.id.startswith("call_")
    assert len(pieces) > 5 and opened > 5  # many pieces, well before the end
    assert "".join(pieces) == call.function.arguments == whole


def test_openai_chat_name_comes_before_the_arguments_end(srv):
    """On the wire: the head chunk (index, id, type, name, empty arguments) comes
    before the content argument is written, not with the finished call."""
    with httpx.stream("POST", srv.v1 + "/chat/completions", timeout=120, json={
            "messages": ASK, "tools": OPENAI_TOOLS, "max_tokens": 400, "stream": True}) as r:
        data = [json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in data
              if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    head = deltas[0]
    assert head["index"] == 0 and head["type"] == "function"
    assert head["function"] == {"name": "write_file", "arguments": ""}
    assert all(set(d) == {"index", "function"} for d in deltas[1:])
    joined = "".join(d["function"]["arguments"] for d in deltas[1:])
    so_far = ["".join(d["function"]["arguments"] for d in deltas[:i]) for i in range(len(deltas))]
    first_body = next(i for i, s in enumerate(so_far) if '"content": "first' in s)
    assert first_body < len(deltas) - 10 and joined.endswith('"mode": 420}')


def test_anthropic_stream_helper_sees_input_json_events(ant, oai):
    whole = whole_arguments(oai)
    pieces, snapshots = [], []
    with ant.messages.stream(model="m", max_tokens=400, messages=ASK,
                             tools=ANTHROPIC_TOOLS) as stream:
        for event in stream:
            if event.type == "input_json":
                pieces.append(event.partial_json)
                snapshots.append(event.snapshot)
        final = stream.get_final_message()
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and block.name == "write_file"
    assert len(pieces) > 5 and "".join(pieces) == whole
    assert block.input == json.loads(whole)
    # the partial input grew while the call was written ({}, the path, the content, ...)
    assert len({json.dumps(s, sort_keys=True) for s in snapshots}) >= 3
    r = ant.messages.create(model="m", max_tokens=400, messages=ASK, tools=ANTHROPIC_TOOLS)
    assert [b.input for b in r.content if b.type == "tool_use"] == [block.input]


def test_responses_stream_sees_argument_deltas(oai):
    whole = whole_arguments(oai)
    kinds, pieces = [], []
    with oai.responses.stream(model="m", input="Write the notes.", tools=RESPONSES_TOOLS,
                              max_output_tokens=400) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                pieces.append(event.delta)
            if event.type == "response.output_item.added" \
                    and event.item.type == "function_call":
                assert event.item.name == "write_file" and event.item.arguments == ""
        final = stream.get_final_response()
    (item,) = [o for o in final.output if o.type == "function_call"]
    assert len(pieces) > 5 and "".join(pieces) == item.arguments == whole
    added = kinds.index("response.output_item.added", kinds.index("response.output_item.done"))
    assert added < kinds.index("response.function_call_arguments.delta") \
        < kinds.index("response.function_call_arguments.done")
    r = oai.responses.create(model="m", input="Write the notes.", tools=RESPONSES_TOOLS,
                             max_output_tokens=400)
    assert [o.arguments for o in r.output if o.type == "function_call"] == [whole]


# -- a call the budget cuts, after its name and some arguments went out

CUT = 50  # tokens: inside the content argument


def test_cut_call_is_withdrawn_on_openai_chat(srv, oai):
    with httpx.stream("POST", srv.v1 + "/chat/completions", timeout=120, json={
            "messages": ASK, "tools": OPENAI_TOOLS, "max_tokens": CUT, "stream": True}) as r:
        data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = [c for c in data if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert len(streamed) > 2  # the head and some pieces went out before the cut
    last = data[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["withdrawn_tool_calls"] == [0]
    r = oai.chat.completions.create(model="m", messages=ASK, tools=OPENAI_TOOLS,
                                    max_tokens=CUT)
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls


def test_cut_call_is_withdrawn_on_anthropic_messages(ant):
    seen = []
    with ant.messages.stream(model="m", max_tokens=CUT, messages=ASK,
                             tools=ANTHROPIC_TOOLS) as stream:
        for event in stream:
            seen.append(event.type)
            if event.type == "message_delta":
                delta = event.delta.model_dump()
        final = stream.get_final_message()
    assert "input_json" in seen and seen.count("content_block_start") == \
        seen.count("content_block_stop")
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "max_tokens"
    assert delta["withdrawn_tool_use_ids"] == [block.id]


def test_cut_call_is_withdrawn_on_responses(oai):
    done_items = []
    with oai.responses.stream(model="m", input="Write the notes.", tools=RESPONSES_TOOLS,
                              max_output_tokens=CUT) as stream:
        for event in stream:
            if event.type == "response.output_item.done":
                done_items.append(event.item)
            last = event
    calls = [i for i in done_items if i.type == "function_call"]
    assert [c.status for c in calls] == ["incomplete"] and calls[0].arguments.startswith("{")
    assert last.type == "response.incomplete"
    assert not [o for o in last.response.output if o.type == "function_call"]
