"""What agent clients send to /v1/messages, through the official anthropic SDK.

The request shapes are Claude Code 2.1.332's, captured from the real client and trimmed:
system blocks led by its ``x-anthropic-billing-header``, a ``role: "system"`` message
after the user turn (with its own ``output_config``), adaptive thinking with
``display: "omitted"``, ``output_config.effort``, ``context_management``, ``metadata``,
a deferred tool placeholder, tool search's ``tool_reference`` blocks and the beta query
string. The model is a scripted tiny checkpoint (tests/scripted_model.py) that records
every prompt it ran, so the tests read back what the model was shown.
"""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import pytest

from mlxbun_core.errors import BadRequest
from mlxbun_core.server.anthropic.request import parse_request
from mlxbun_core.testing.helpers import configure
from scripted_model import scripted_server

BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14",
         "context-management-2025-06-27", "effort-2025-11-24"]
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"
ENV_NOTE = ("# Environment\nYou have been invoked in the following environment: \n"
            " - Primary working directory: /tmp/project\n - Is a git repository: false\n"
            " - Platform: linux\n - Shell: bash\n\nToday's date is 2026-12-01.")
READ = {"name": "Read", "description": "Reads a file from the local filesystem.",
        "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema",
                         "type": "object", "additionalProperties": False,
                         "properties": {"file_path": {"type": "string"}},
                         "required": ["file_path"]}}
PLACEHOLDER = {"name": "DeferredToolPlaceholder",
               "description": "Reserved placeholder that keeps deferred tool loading active; "
                              "never call this tool.",
               "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}
WEBFETCH = {"name": "WebFetch", "description": "Fetches a URL, converts the page to markdown.",
            "input_schema": {"type": "object", "properties": {"url": {"type": "string"}},
                             "required": ["url"]}, "defer_loading": True}


def claude_code_body(question: str = "say hi", billing: str = BILLING) -> dict:
    """A Claude Code first request, as the client sends it (texts shortened)."""
    return {
        "model": "claude-opus-5-5", "max_tokens": 32,
        "system": [{"type": "text", "text": billing},
                   {"type": "text", "text": "You are a Claude agent, built on Anthropic's "
                    "Claude Agent SDK.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "\nYou are an agent working with the user toward "
                    "their goals.\n\n", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nEnd git commit messages with a "
                 "Co-Authored-By line.\n</system-reminder>\n"},
                {"type": "text", "text": question}]},
            {"role": "system", "content": [{"type": "text", "text": ENV_NOTE,
                                            "cache_control": {"type": "ephemeral"}}],
             "output_config": {"effort": "medium"}}],
        "tools": [READ, PLACEHOLDER],
        "metadata": {"user_id": json.dumps({"device_id": "0" * 64, "account_uuid": "",
                                            "session_id": "9a411db5"})},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
    }


@pytest.fixture(scope="module")
def server():
    with scripted_server("Hello there!", name="scripted-anthropic-clients",
                         seed=4646) as (srv, plugin):
        yield srv, plugin


@pytest.fixture
def plugin(server):
    server[1].text = "Hello there!"
    return server[1]


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server[0].base_url, api_key="test", max_retries=0)


def create(client, body: dict):
    return client.beta.messages.create(betas=BETAS, **body)  # POST /v1/messages?beta=true


def prompt_tokens(usage) -> int:
    """The whole prompt, as Anthropic splits it: uncached, written to and read from the
    cache (Claude Code's bodies carry cache_control breakpoints)."""
    return (usage.input_tokens + (usage.cache_creation_input_tokens or 0)
            + (usage.cache_read_input_tokens or 0))


# ------------------------------------------------------------------ through the server

def test_claude_code_request_is_served(client, plugin):
    msg = create(client, claude_code_body("first question"))
    assert msg.content[0].text == "Hello there!" and msg.stop_reason == "end_turn"
    seen = plugin.prompts[-1]
    # the system blocks as one system turn, without the billing header
    assert seen.startswith("<|im_start|>system\nYou are a Claude agent, built on Anthropic's "
                           "Claude Agent SDK.\nYou are an agent working")
    assert "x-anthropic-billing-header" not in seen and "cc_version" not in seen
    # the system-role message: a system turn of its own, after the user's turn
    user_at = seen.index("first question")
    assert seen.index("<|im_start|>system\n" + ENV_NOTE + "<|im_end|>") > user_at
    assert seen.endswith(ENV_NOTE + "<|im_end|>\n<|im_start|>assistant\n")
    # the deferred placeholder is not shown; the loaded tool is
    assert '"name": "Read"' in seen and "DeferredToolPlaceholder" not in seen


def test_claude_code_stream_on_the_beta_path(server, plugin):
    srv, _ = server
    # Claude Code's own budget: the server clamps it to the room left in the context
    body = {**claude_code_body("streamed question"), "stream": True, "max_tokens": 128000}
    headers = {"anthropic-beta": ",".join(BETAS), "anthropic-version": "2023-06-01",
               "x-api-key": "test"}
    with httpx.stream("POST", srv.v1 + "/messages?beta=true", json=body, headers=headers) as r:
        assert r.status_code == 200
        events = [line.removeprefix("event: ") for line in r.iter_lines()
                  if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    count = httpx.post(srv.v1 + "/messages/count_tokens?beta=true", headers=headers,
                       json={k: v for k, v in body.items() if k not in ("max_tokens", "stream")})
    assert count.status_code == 200 and count.json()["input_tokens"] > 0


def test_billing_header_change_keeps_the_prefix_cache(client, plugin):
    """Claude Code's billing header changes with its version and entry point; the
    second conversation must still find the shared prefix in the cache."""
    first = create(client, claude_code_body("cache question", "x-anthropic-billing-header: "
                                            "cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"))
    again = create(client, claude_code_body("cache question", "x-anthropic-billing-header: "
                                            "cc_version=2.1.340.1f2; cc_entrypoint=cli;"))
    total = prompt_tokens(again.usage)
    assert total == prompt_tokens(first.usage)
    assert again.usage.cache_read_input_tokens >= 0.9 * total


def test_volatile_header_kept_when_switched_off(client, plugin, monkeypatch):
    configure(monkeypatch, server={"keep_volatile_system": True})
    create(client, claude_code_body("kept question", "x-anthropic-billing-header: "
                                    "cc_version=9.0.0.aaa; cc_entrypoint=cli;"))
    assert "cc_version=9.0.0.aaa" in plugin.prompts[-1]
    again = create(client, claude_code_body("kept question", "x-anthropic-billing-header: "
                                            "cc_version=9.0.1.bbb; cc_entrypoint=cli;"))
    assert (again.usage.cache_read_input_tokens or 0) < 0.2 * prompt_tokens(again.usage)


def test_thinking_omitted_keeps_the_block_not_the_text(client, server, plugin):
    plugin.text = "<think>a private plan</think>Hi!"
    msg = create(client, claude_code_body("think question"))
    assert [(b.type, getattr(b, "thinking", None)) for b in msg.content[:1]] == [("thinking", "")]
    assert msg.content[1].text == "Hi!"
    body = {**claude_code_body("think question"), "stream": True}
    with httpx.stream("POST", server[0].v1 + "/messages?beta=true", json=body) as r:
        frames = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    starts = [f["content_block"]["type"] for f in frames if f["type"] == "content_block_start"]
    deltas = [f["delta"]["type"] for f in frames if f["type"] == "content_block_delta"]
    assert starts == ["thinking", "text"] and "thinking_delta" not in deltas
    assert "a private plan" not in json.dumps(frames)


def test_tool_use_ids_are_anthropic_shaped_and_round_trip(client, plugin):
    plugin.text = ('<tool_call>{"name": "Read", "arguments": {"file_path": "/tmp/a.txt"}}'
                   '</tool_call>')
    body = claude_code_body("read a.txt")
    msg = create(client, body)
    use = msg.content[-1]
    assert use.type == "tool_use" and use.id.startswith("toolu_") and len(use.id) > 12
    plugin.text = "It says hello."
    body["messages"] += [
        {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "1\thello from a.txt"}]}]
    final = create(client, body)
    assert final.content[0].text == "It says hello."
    assert "1\thello from a.txt" in plugin.prompts[-1]
    assert final.usage.cache_read_input_tokens > 0.5 * prompt_tokens(msg.usage)


def test_tool_search_reference_loads_a_deferred_tool(client, plugin):
    """ToolSearch answers with ``tool_reference`` blocks: the deferred tool's definition
    shows where the reference stands, and the tool list up front stays as it was."""
    body = claude_code_body("fetch a page")
    body["tools"] = [READ, PLACEHOLDER, WEBFETCH]
    body["messages"] += [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01search",
                                           "name": "ToolSearch",
                                           "input": {"query": "select:WebFetch"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01search",
             "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]},
            {"type": "text", "text": "Tool loaded.", "cache_control": {"type": "ephemeral"}}]}]
    assert create(client, body).content[0].text == "Hello there!"
    seen = plugin.prompts[-1]
    shown = ('<function>{"description": "Fetches a URL, converts the page to markdown.", '
             '"name": "WebFetch", "parameters": ')
    assert seen.count('"name": "WebFetch"') == 1 and seen.index(shown) > seen.index("fetch a page")


def test_prompt_over_the_context_is_said_as_anthropic_says_it(client, plugin):
    """The form Claude Code parses for the token counts (no model work happens:
    admission refuses before prefill)."""
    body = claude_code_body("a " * 45000)
    with pytest.raises(anthropic.BadRequestError) as err:
        create(client, body)
    message = err.value.body["error"]["message"]
    assert err.value.body["error"]["type"] == "invalid_request_error"
    tokens, limit = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum "
                                 r"\(the model's context window; serve with --context-length "
                                 r"N for a longer one\)", message).groups()
    assert int(tokens) > int(limit) == 40960  # the tiny qwen3 checkpoint's window


# ------------------------------------------------------------------ the translation

def test_system_messages_in_place_with_clear_at():
    body = {"max_tokens": 8, "messages": [
        {"role": "user", "content": "one"},
        {"role": "system", "content": "until the next user turn", "clear_at": "next_user_message"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": [{"type": "text", "text": "still here"},
                                       {"type": "tool_addition",
                                        "tool": {"type": "tool_reference", "tool_name": "Read"}}],
         "clear_at": "never"},
        {"role": "user", "content": "two"},
        {"role": "system", "content": "shown now", "clear_at": "next_user_message"}]}
    roles = [(m["role"], m["content"]) for m in parse_request(body).messages]
    assert roles == [("user", "one"), ("assistant", "ok"), ("system", "still here"),
                     ("user", "two"), ("system", "shown now")]


@pytest.mark.parametrize("thinking,config,turn,expected", [
    ({"type": "adaptive", "display": "omitted"}, {"effort": "medium"}, None, (None, "medium")),
    ({"type": "adaptive"}, None, None, (None, None)),
    ({"type": "enabled", "budget_tokens": 2048}, {"effort": "max"}, None, (True, "xhigh")),
    ({"type": "between_tools"}, None, None, (True, None)),
    ({"type": "disabled"}, {"effort": "high"}, None, (False, "high")),
    ({"type": "adaptive"}, {"effort": "medium"}, {"effort": "low"}, (None, "low")),
])
def test_thinking_and_effort_mapping(thinking, config, turn, expected):
    system = {"role": "system", "content": "note"}
    if turn is not None:
        system["output_config"] = turn
    body = {"max_tokens": 8, "thinking": thinking,
            "messages": [{"role": "user", "content": "hi"}, system]}
    if config is not None:
        body["output_config"] = config
    chat = parse_request(body)
    assert (chat.template_kwargs.get("enable_thinking"), chat.reasoning_effort) == expected


def test_a_system_message_before_an_answer_sets_no_effort_for_the_next_turn():
    body = {"max_tokens": 8, "output_config": {"effort": "high"}, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "output_config": {"effort": "low"}},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"}]}
    chat = parse_request(body)
    assert chat.reasoning_effort == "high"
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "user"]


@pytest.mark.parametrize("message,fragment", [
    ({"role": "system"}, "needs content or output_config"),
    ({"role": "system", "content": 5}, "content must be a string or a list"),
    ({"role": "system", "content": [{"type": "image"}]}, "not 'image'"),
    ({"role": "system", "content": "x", "clear_at": "later"}, "clear_at must be one of"),
    ({"role": "system", "content": "x", "output_config": {"effort": 3}},
     "messages[1].output_config.effort must be a non-empty string"),
    ({"role": "developer", "content": "x"}, "messages[1].role must be one of"),
])
def test_bad_system_messages_are_400s(message, fragment):
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}, message]}
    with pytest.raises(BadRequest) as err:
        parse_request(body)
    assert fragment in err.value.message


@pytest.mark.parametrize("system,expected", [
    ([{"type": "text", "text": BILLING}, {"type": "text", "text": "Be brief."}], "Be brief."),
    (BILLING + "\nBe brief.", "Be brief."),
    ([{"type": "text", "text": "Be brief. x-anthropic-billing-header: stays"}],
     "Be brief. x-anthropic-billing-header: stays"),
])
def test_billing_header_dropped_from_either_system_form(system, expected):
    chat = parse_request({"max_tokens": 8, "system": system,
                          "messages": [{"role": "user", "content": "hi"}]})
    assert chat.messages[0] == {"role": "system", "content": expected}
