"""Generated request bodies for every POST route, and the checks a reply must pass.

A body starts as one of the route's valid seed bodies (plain, streaming, tools and
tool history, structured output, media, every sampler field) and takes a few
mutations: a value anywhere in the tree replaced by an edge value (huge ints,
tiny and huge floats, wrong types, odd strings, small random JSON), a key or item
dropped, a known field added at the top or in any nested object. Mostly-valid
bodies reach deep code (templates, grammars, samplers, tool parsers); raw bodies
cover what is not a JSON object at all (truncations, deep nesting, invalid UTF-8,
lone surrogates). Length fields stay small, so thousands of bodies take seconds
against a tiny checkpoint. Needs the ``test`` extra (hypothesis).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
OPENAI = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings",
          "/v1/adapters")
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
ROUTES = OPENAI[:4] + ANTHROPIC  # the request routes; admin routes below
# admin routes that touch files or start jobs; they answer {"ok": false, "error": ...}
JOBS = ("/api/finetune/submit", "/api/finetune/inspect-dataset", "/api/finetune/merge",
        "/api/finetune/export", "/api/quantize/inspect", "/api/quantize/submit")
ADMIN = ("/v1/adapters",) + JOBS

# ---------------------------------------------------------------- values

EDGES: list[Any] = [
         None, True, False, 0, 1, -1, 2, 11, 12, 255, 1024, 2**31 - 1, 2**31, -(2**31),
         2**53 + 1, 2**63 - 1, 2**63, -(2**63), 2**64, 10**30, -(10**30), 0.0, -0.0, 0.5,
         -0.5, 1.5, 2.0000001, 100.5, 5e-324, 1e-300, 3.4e38, 3.5e38, 1e300, -1e300,
         1.7976931348623157e308, "", " ", "x", "0", "1.5", "-1", "nan", "inf", "auto", "none",
         "required", "any", "tool", "function", "text", "image", "json_object", "json_schema",
         "user", "assistant", "system", "tool_use", "enabled", "high", "max", "\x00",
         "\ud83d\ude00",
         "{", "[[[[", "<tool_call>", "{{ 1 }}", "{% raw %}", "a" * 3000, [], {}, [None], [[]],
         [{}], ["a", 1], [1, 2, 3], {"": None}, {"type": None}, {"type": "text"},
         {"type": "text", "text": 5}, {"type": "function"}, {"name": 5}, {"type": "object"},
         {"type": "json_schema", "json_schema": {}}, [{"type": "text", "text": "t"}],
         [{"role": "user"}], {"function": {"name": "f"}}]
values = (st.sampled_from(EDGES) | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
          | st.text(max_size=8))
# what a length field may become: small, or not an integer at all (never a long generation)
limits: st.SearchStrategy[Any] = (st.integers(-2, 6)
                                  | st.sampled_from([None, 0, 4.0, "4", True, [], {}, -(2**63)]))

# ---------------------------------------------------------------- seed bodies

USER = [{"role": "user", "content": "Hi there"}]
SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["a"],
    "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}}}
TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
SAMPLERS = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 3,
            "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1,
            "repetition_context_size": 16, "xtc_probability": 0.1, "xtc_threshold": 0.1}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
CHAT = [
    {"messages": USER},
    {"model": "m", "messages": [{"role": "system", "content": "Be brief."}] + USER,
     "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
     "stop": ["\n\n", "END"], "logit_bias": {"5": 1.5}, "logprobs": True, "top_logprobs": 2,
     **SAMPLERS},
    {"messages": USER + [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
     "tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False, "max_tokens": 4},
    {"messages": [{"role": "developer", "content": [{"type": "text", "text": "JSON only"}]},
                  {"role": "user", "content": [{"type": "text", "text": "Give me a"}]}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}},
     "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"},
    {"messages": USER, "guided_choice": ["yes", "no"], "stream": True, "max_completion_tokens": 3},
    {"messages": USER, "guided_regex": "[a-z]{1,5}", "tools": [TOOL],
     "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
    {"messages": USER, "stream": True, "tool_choice": "required", "parallel_tool_calls": True,
     "tools": [{"type": "function", "function": {**TOOL["function"], "strict": True}}]},
    {"messages": [{"role": "user", "content": [  # every media alias (models without media: 400)
        {"type": "text", "text": "see"}, {"type": "input_audio", "input_audio": {
            "data": "AAAA", "format": "wav"}}, {"type": "image", "data": "AAAA"},
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}]},
]
COMPLETIONS = [
    {"prompt": "Once upon a time"},
    {"model": "m", "prompt": "Once", "max_tokens": 4, "stream": True, "stop": "\n",
     "logprobs": True, **SAMPLERS, "logit_bias": {"7": -100}},
    {"prompt": "{", "response_format": {"type": "json_object"}, "max_tokens": 5},
    {"prompt": "Say", "guided_grammar": 'root ::= "yes" | "no"', "stream": True},
]
RESPONSES = [
    {"input": "Hi"},
    {"model": "m", "instructions": "Be brief.", "max_output_tokens": 4, "stream": True,
     "store": False, "input": [
         {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
         {"type": "function_call", "call_id": "c1", "name": "get_weather",
          "arguments": "{\"city\": \"Paris\"}"},
         {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
         {"type": "reasoning", "summary": []}],
     "tools": [{"type": "function", "name": "get_weather",
                "parameters": TOOL["function"]["parameters"]}, {"type": "web_search"}],
     "tool_choice": "auto", "temperature": 0.5, "top_p": 0.9},
    {"input": [{"type": "message", "role": "developer", "content": "JSON"},
               {"role": "user", "content": "a"}],
     "text": {"format": {"type": "json_schema", "name": "o", "schema": SCHEMA}},
     "reasoning": {"effort": "low"}, "metadata": {"k": "v"}},
    {"input": "Again", "previous_response_id": "resp_unknown"},
    {"input": "Weather?", "tool_choice": "required", "max_output_tokens": 6,
     "tools": [{"type": "function", "name": "get_weather", "strict": True,
                "parameters": TOOL["function"]["parameters"]}]},
]
A_TOOL = {"name": "get_weather", "description": "Weather",
          "input_schema": TOOL["function"]["parameters"]}
MESSAGES = [
    {"max_tokens": 4, "messages": USER},
    {"model": "m", "max_tokens": 4, "stream": True, "system": [{"type": "text", "text": "Brief"}],
     "messages": USER + [
         {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "hmm", "signature": ""},
             {"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": "P"}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "tu1", "content": "sunny"},
             {"type": "text", "text": "thanks"}]}],
     "tools": [A_TOOL, {"type": "web_search_20250305", "name": "web_search"}],
     "tool_choice": {"type": "auto"}, "temperature": 0.5, "top_k": 5, "top_p": 0.9,
     "stop_sequences": ["END"], "metadata": {"user_id": "u"},
     "thinking": {"type": "disabled"}},
    {"max_tokens": 4, "messages": USER, "output_config": {"effort": "low", "format": {
        "type": "json_schema", "schema": SCHEMA}}, "presence_penalty": 0.1, "seed": 1},
    {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}}]}],
     "tool_choice": {"type": "tool", "name": "get_weather"}, "tools": [A_TOOL]},
    {"max_tokens": 6, "messages": USER, "tools": [A_TOOL], "stream": True,
     "tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
    # Claude Code's shape: billing header, a system-role message, tool search, adaptive thinking
    {"max_tokens": 4, "stream": True,
     "system": [{"type": "text",
                 "text": "x-anthropic-billing-header: cc_version=1; cc_entrypoint=cli;"},
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
     "messages": USER + [
         {"role": "system", "content": [{"type": "text", "text": "env"}],
          "output_config": {"effort": "medium"}, "clear_at": "never"},
         {"role": "assistant", "content": [
             {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"q": "x"}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_1",
              "content": [{"type": "tool_reference", "tool_name": "get_weather"}]}]},
         {"role": "system", "content": "late", "clear_at": "next_user_message"}],
     "tools": [{**A_TOOL, "defer_loading": True},
               {"name": "ToolSearch", "input_schema": {"type": "object"}}],
     "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "max"},
     "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}},
]
EMBEDDINGS = [{"input": "hello"},
              {"model": "m", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8}]
SEEDS: dict[str, list[Any]] = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS,
                               "/v1/responses": RESPONSES, "/v1/messages": MESSAGES,
                               "/v1/messages/count_tokens": [
                                   {k: v for k, v in b.items() if k != "stream"}
                                   for b in MESSAGES],
                               "/v1/embeddings": EMBEDDINGS}


def admin_seeds(model_dir: str, data_dir: str) -> dict:
    """Seed bodies for the admin routes. Those that would start a job or write files
    point at paths that do not exist, so no mutation of them starts real work; the
    read-only ones point at a real checkpoint and dataset."""
    missing = "/nonexistent/mlxbun-fuzz"
    return {
        "/v1/adapters": [{"id": "a", "path": missing + "/adapter", "force": False}],
        "/api/finetune/submit": [{"model_dir": missing, "data_dir": data_dir, "iters": 1,
                                  "rank": 4, "learning_rate": 1e-4, "method": "sft"},
                                 {"model_dir": model_dir, "data_dir": missing,
                                  "adapter_path": missing + "/out"}],
        "/api/finetune/inspect-dataset": [{"path": data_dir}],
        "/api/finetune/merge": [{"adapter_a": missing + "/a", "adapter_b": missing + "/b",
                                 "scales": [0.5, 0.5]}],
        "/api/finetune/export": [{"base_model": "m", "adapter_path": missing + "/a",
                                  "method": "merge"}],
        "/api/quantize/inspect": [{"model_id": model_dir}],
        "/api/quantize/submit": [{"model_id": missing, "bits": 4, "group_size": 64,
                                  "mode": "affine", "recipe": "mixed_3_6"}],
    }


def _keys(tree, found: set) -> set:
    if isinstance(tree, dict):
        found.update(tree)
        for v in tree.values():
            _keys(v, found)
    elif isinstance(tree, list):
        for v in tree:
            _keys(v, found)
    return found


# keys worth adding anywhere: every key any seed uses, plus a few the seeds leave out
KNOWN_KEYS = sorted(_keys([*SEEDS.values()], set()) - set(LIMIT_FIELDS) | {
    "n", "echo", "suffix", "user", "name", "budget_tokens", "disable_parallel_tool_use",
    "structured_outputs", "adapter", "truncation", "strict", "is_error", "cache_control",
    "encoding_format", "input_audio", "url", "data", "media_type", "reasoning_content"})

# ---------------------------------------------------------------- mutation


def _paths(tree, here=()):
    """Every (path, node) in ``tree``, root first."""
    yield here, tree
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) \
        if isinstance(tree, list) else ()
    for key, value in items:
        yield from _paths(value, here + (key,))


def _parent(tree, path):
    for key in path[:-1]:
        tree = tree[key]
    return tree


@st.composite
def mutated(draw, route: str, seeds=None) -> dict:
    """A seed body of ``route`` (from ``seeds`` or :data:`SEEDS`) with up to three mutations."""
    body = copy.deepcopy(draw(st.sampled_from((seeds or SEEDS)[route])))
    for _ in range(draw(st.integers(0, 3))):
        nodes = list(_paths(body))
        op = draw(st.sampled_from(("set", "set", "set", "add", "drop")))
        if op == "add":
            objects = [n for _, n in nodes if isinstance(n, dict)]
            node = objects[draw(st.integers(0, len(objects) - 1))]
            key = draw(st.sampled_from(KNOWN_KEYS))
            node[key] = copy.deepcopy(draw(values))  # never edit a shared EDGES value
            continue
        if len(nodes) < 2:
            continue
        path = nodes[-1 - draw(st.integers(0, len(nodes) - 2))][0]  # leaves first: draws favour 0
        parent = _parent(body, path)
        if op == "drop":
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(limits if path[-1] in LIMIT_FIELDS else values))
    return body


_deep = st.integers(65, 6000).map(lambda n: "[" * n + "]" * n)
raw = st.one_of(
    st.binary(max_size=48),
    st.sampled_from([b"", b" ", b"null", b"[]", b"1", b'"x"', b"\xff\xfe\xfd", b"{",
                     b'{"messages": [}', b"\xef\xbb\xbf{}", b'{"a": NaN}', b'{"a": Infinity}',
                     b'{"a": 1e999}', b'{"a": "\\ud800"}', b'{"a": "\\udfff\\ud800"}',
                     b'{"a": ' + b"9" * 5000 + b"}", b'{"a": 1}{"b": 2}', b"\x00",
                     b'{"messages": "\xff"}']),
    _deep.map(str.encode),
    _deep.map(lambda d: ('{"messages": ' + d + ', "input": ' + d + "}").encode()),
)


@st.composite
def encoded(draw, route: str, seeds=None) -> bytes:
    """Bytes to POST to ``route``: mostly a mutated body, else its JSON cut short or a raw
    oddity."""
    kind = draw(st.integers(0, 9))
    if kind == 9:
        return draw(raw)
    text = json.dumps(draw(mutated(route, seeds)), ensure_ascii=draw(st.booleans()))
    sent = text.encode("utf-8", "surrogatepass")
    return sent[:draw(st.integers(0, len(sent) - 1))] if kind == 8 else sent


# ---------------------------------------------------------------- checking a reply

def error_shape_ok(route: str, data) -> bool:
    """The surface's own error shape: OpenAI ``{"error": {...}}``, Anthropic
    ``{"type": "error", ...}``, the job routes ``{"ok": false, "error": "..."}``."""
    if route in JOBS:
        return (isinstance(data, dict) and data.get("ok") is False
                and isinstance(data.get("error"), str) and data["error"] != "")
    err = data.get("error") if isinstance(data, dict) else None
    if not (isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]
            and isinstance(err.get("type"), str)):
        return False
    return data.get("type") == "error" if route in ANTHROPIC else True


def stream_failures(route: str, text: str) -> list:
    """Error events in an SSE reply: a failure after the 200 is as bad as a 500."""
    bad = []
    for line in text.splitlines():
        if line.startswith("event:") and line[6:].strip() in ("error", "response.failed"):
            bad.append(line)
        elif line.startswith("data:") and route in ("/v1/chat/completions", "/v1/completions"):
            payload = line[5:].strip()
            if payload != "[DONE]" and "error" in json.loads(payload):
                bad.append(payload)
    return bad


def stream_finished(route: str, text: str) -> bool:
    """The stream ended the way its protocol ends, not cut off."""
    ends = {"/v1/chat/completions": ["data: [DONE]"], "/v1/completions": ["data: [DONE]"],
            "/v1/messages": ["event: message_stop"],
            "/v1/responses": ["event: response.completed", "event: response.incomplete"]}[route]
    return any(end in text for end in ends)


def check_reply(route: str, sent: bytes, status: int, content_type: str, text: str) -> None:
    """What every reply to any body must be: no 5xx; a 4xx in the surface's error shape;
    a 200 that is whole (a stream ends properly, with no error event)."""
    where = f"{route} {status} for {sent[:400]!r}: {text[:300]}"
    assert status < 500, where
    if status >= 400:
        assert status in (400, 404, 413, 422, 429), where
        assert error_shape_ok(route, json.loads(text)), where
        return
    assert status == 200, where
    if content_type.startswith("text/event-stream"):
        assert not stream_failures(route, text), where
        assert stream_finished(route, text), where
        return
    data = json.loads(text)
    assert isinstance(data, dict), where
    if route not in JOBS:  # inspections answer 200 {"ok": false, "error": ...} by design
        assert data.get("error") is None, where
    if route == "/v1/responses":
        assert data["status"] in ("completed", "incomplete"), where
