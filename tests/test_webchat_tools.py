"""The web chat's app-aware tools and thinking, through the real engine: a scripted model
(tests/scripted_model.py) emits exact text, everything after the logits is the real path."""

from __future__ import annotations

import json

import pytest

from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webchat.turn import MAX_TOOL_ROUNDS
from scripted_model import scripted_server


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def scripted():
    with scripted_server("", name="scripted-webchat") as (srv, plugin):
        yield srv, plugin


def test_thinking_streams_apart_from_the_answer(scripted):
    srv, plugin = scripted
    plugin.text = "<think>Plan a greeting.</think>Hello there!"
    with ChatClient(srv.base_url) as c:
        c.hello()
        frames = c.turn(text="Hi")
    thinking = "".join(f["delta"] for f in frames if f["type"] == "thinking_delta")
    answer = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
    assert thinking.strip() == "Plan a greeting." and answer.strip() == "Hello there!"
    saved = frames[-1]["items"][-1]
    assert saved["reasoning"] == thinking and saved["content"] == answer
    assert next(f for f in frames if f["type"] == "turn_end")["lane"] == "serial"


def test_navigate_app_drives_the_page_and_tool_rounds_are_capped(scripted):
    srv, plugin = scripted
    plugin.text = "Opening it. " + call("navigate_app", route="status")
    with ChatClient(srv.base_url) as c:
        c.hello()
        frames = c.turn(text="Show me the server status")
    kinds = [f["type"] for f in frames]
    assert kinds.count("turn_start") == 1 and kinds.count("turn_end") == 1
    starts = [f for f in frames if f["type"] == "tool_start"]
    assert len(starts) == MAX_TOOL_ROUNDS  # the model keeps asking; the turn stops at the cap
    assert all(s["tool"] == "navigate_app" and json.loads(s["args"]) == {"route": "status"}
               for s in starts)
    assert [f for f in frames if f["type"] == "ui_navigate"] == [
        {"type": "ui_navigate", "route": "status"}] * MAX_TOOL_ROUNDS
    ends = [f for f in frames if f["type"] == "tool_end"]
    assert all(e["ok"] and e["result"] == {"navigated": "status"} for e in ends)
    assert [e["callId"] for e in ends] == [s["callId"] for s in starts]
    assert frames[kinds.index("turn_end")]["finish"] == "tool_calls"
    roles = [i["role"] for i in frames[-1]["items"]]
    assert roles == ["user"] + ["assistant", "tool"] * MAX_TOOL_ROUNDS + ["assistant"]
    tool_items = [i for i in frames[-1]["items"] if i["role"] == "tool"]
    assert all(json.loads(i["content"]) == {"navigated": "status"} for i in tool_items)


def test_unknown_routes_are_tool_errors_never_sent_to_the_page(scripted):
    srv, plugin = scripted
    plugin.text = call("navigate_app", route="wiki")
    with ChatClient(srv.base_url) as c:
        c.hello()
        frames = c.turn(text="Quantize something")
    assert not [f for f in frames if f["type"] == "ui_navigate"]
    end = next(f for f in frames if f["type"] == "tool_end")
    assert end["ok"] is False and "unknown route 'wiki'" in end["result"]["error"]


def test_the_assistant_reads_the_context_the_page_pushed(scripted):
    srv, plugin = scripted
    plugin.text = call("get_current_app_context")
    context = {"route": "status", "view": "server status", "snapshot": {
        "route": "status", "elements": [
            {"ref": "e1", "label": "Refresh", "kind": "button", "selector": "#status-refresh"}]}}
    with ChatClient(srv.base_url) as c:
        c.hello()
        c.send("context", context=context)
        frames = c.turn(text="What am I looking at?")
        plugin.text = call("spotlight_ui", ref="e1", message="Click to refresh")
        spotted = c.turn(text="Where do I refresh?")
    end = next(f for f in frames if f["type"] == "tool_end")
    assert end["ok"] and end["result"]["route"] == "status"
    assert end["result"]["snapshot"]["elements"][0]["selector"] == "#status-refresh"
    assert {"type": "ui_spotlight", "ref": "e1", "message": "Click to refresh"} in spotted
