"""Core tool-call parsing: streaming splitter, repair, coercion, JsonDialect."""

import json
import re

import pytest

from mlxbun_core.events import KEEPALIVE
from mlxbun_core.toolcalls import (
    Dialect,
    JsonDialect,
    MlxLmDialect,
    StreamingToolParser,
    ToolCall,
    coerce_arguments,
    dialect_for_parser,
    dialect_for_tokenizer,
    find_tool,
    make_call,
    normalize_call,
    repair_json,
    split_tool_calls,
    tool_params,
)
from mlxbun_core.toolcalls.testing import chunkings, events_all_chunkings, normalize, run_chunks

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "metric": {"type": "boolean"}, "zip": {"type": "string"}}}}},
    {"name": "flat", "input_schema": {"type": "object", "properties": {"x": {"type": "number"}}}}]


def P(tools=TOOLS):
    return lambda: StreamingToolParser(JsonDialect(), tools)


def call(name, **args):
    return ("tool_call", name, args)


# ------------------------------------------------------------------ streaming

def test_content_call_content_all_chunkings():
    text = ('Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 2}}\n</tool_call>\nDone.')
    assert events_all_chunkings(P(), text) == [
        ("content", "Let me check."), call("get_weather", city="Paris", days=2),
        ("content", "\nDone.")]


def test_back_to_back_calls_drop_separator_whitespace():
    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    text = one % "A" + "\n" + one % "B" + "\n"
    assert events_all_chunkings(P(), text) == [
        call("get_weather", city="A"), call("get_weather", city="B")]


def test_plain_text_passes_through_exactly():
    text = "no tools here, just <b>html</b> and a < sign\n  "
    assert events_all_chunkings(P(), text) == [("content", text)]


def test_content_streams_before_markup_completes():
    p = P()()
    ev = p.feed("Hello there ")
    ev += p.feed('<tool_call>{"name": "get_wea')
    assert normalize(ev) == [("content", "Hello there")]
    ev2 = p.feed('ther", "arguments": {}}</tool_call>')
    assert normalize(ev2) == [call("get_weather")]
    assert p.finish() == []


def test_marker_prefix_held_back_until_disambiguated():
    p = P()()
    assert normalize(p.feed("abc <tool_")) == [("content", "abc")]
    assert normalize(p.feed("x")) == [("content", " <tool_x")]
    assert normalize(p.feed("<")) == []
    assert normalize(p.finish()) == [("content", "<")]


def test_marker_split_every_way():
    text = 'a<tool_call>{"name": "get_weather"}</tool_call>b'
    for k in range(len(text)):
        assert run_chunks(P(), [text[:k], text[k:]]) == [
            ("content", "a"), call("get_weather"), ("content", "b")]


def test_keepalive_every_256_chars_of_markup():
    body = "x" * 700
    text = 'hi <tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>' % body
    markup_len = len(text) - 3
    ev = events_all_chunkings(P(), text)
    n_ka = (markup_len - 1) // 256
    assert n_ka == 3
    assert ev == [("content", "hi")] + [("keepalive",)] * n_ka + [call("get_weather", city=body)]


def test_keepalive_emitted_while_buffering():
    p = P()()
    ev = p.feed("<tool_call>" + "{" + " " * 300)
    assert ev == [KEEPALIVE]
    assert p.feed(" " * 10) == []
    assert p.feed(" " * 300) == [KEEPALIVE]


def test_keepalive_counter_resets_per_block():
    # ~220 chars: under 256 per block, over 256 together
    blk = ('<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
           % ("y" * 150))
    ev = events_all_chunkings(P(), blk + blk)
    assert [e[0] for e in ev] == ["tool_call", "tool_call"]


def test_cut_call_is_dropped_never_repaired_into_a_call():
    """A call the budget cut is not a call (an agent would run it with made-up
    arguments) and not text; at the model's own EOS an unclosed block that is not
    whole is a call stopped half-way: dropped too."""
    for text in ['ok <tool_call>{"name": "get_weather", "arguments": {"city": "Par',
                 'ok <tool_call>{"name": "get_weather"', "ok\n<tool_call>", "ok <tool_call> nope"]:
        for cut in (True, False):
            assert events_all_chunkings(P(), text, cut=cut) == [("content", "ok")], (text, cut)


def test_cut_drops_a_held_start_marker_prefix():
    assert events_all_chunkings(P(), "ok <tool_c", cut=True) == [("content", "ok ")]
    assert events_all_chunkings(P(), "ok <tool_c") == [("content", "ok <tool_c")]
    done = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert events_all_chunkings(P(), done + "\n<tool_", cut=True) == [call("get_weather")]


def test_whole_call_missing_only_its_end_marker_at_eos():
    text = 'ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    assert events_all_chunkings(P(), text) == [("content", "ok"), call("get_weather", city="Paris")]
    assert events_all_chunkings(P(), text, cut=True) == [("content", "ok")]


def test_garbage_markup_falls_back_to_content():
    text = "see\n<tool_call>this is not json</tool_call> after"
    assert events_all_chunkings(P(), text) == [("content", text)]


def test_tool_call_event_carries_toolcall():
    p = P()()
    ev = p.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "X"}}</tool_call>')
    *streamed, e = ev  # the call streamed (start, argument pieces), then the whole call
    tc = e.call
    assert [x.kind for x in streamed][:1] == ["tool_call_start"]
    assert e.kind == "tool_call" and isinstance(tc, ToolCall)
    assert re.fullmatch(r"call_[0-9a-f]{24}", tc.id)
    assert json.loads(tc.arguments) == {"city": "X"} and p.calls == [tc]


def test_split_tool_calls_nonstreaming():
    content, calls = split_tool_calls(JsonDialect(), TOOLS,
                                      'A<tool_call>{"name":"flat","arguments":{"x":"1.5"}}</tool_call>')
    assert content == "A" and calls[0].name == "flat" and calls[0].args == {"x": 1.5}


def test_dialect_exception_falls_back_to_content():
    class Boom(Dialect):
        starts, end = ("<x>",), "</x>"

        def parse(self, markup, tools):
            raise RuntimeError

    assert run_chunks(lambda: StreamingToolParser(Boom()), ["a <x>1</x>"]) == [
        ("content", "a <x>1</x>")]


def test_chunkings_helper_covers_char_by_char():
    cs = chunkings("abcdef")
    assert ["abcdef"] in cs and list("abcdef") in cs


# --------------------------------------------------------------------- repair

@pytest.mark.parametrize("text,want", [
    ('{"a": 1}', {"a": 1}),
    ('```json\n{"a": 1}\n```', {"a": 1}),
    ('```\n[1, 2]\n```', [1, 2]),
    ('Sure! Here is the call: {"a": 1}', {"a": 1}),
    ("{'a': 'b', 'c': \"it's\"}", {"a": "b", "c": "it's"}),
    ("{'a': 'it\\'s'}", {"a": "it's"}),
    ("{'q': 'say \"hi\"'}", {"q": 'say "hi"'}),
    ('{"a": [1, 2,], "b": 3,}', {"a": [1, 2], "b": 3}),
    ('{"a": {"b": [1, 2', {"a": {"b": [1, 2]}}),
    ('{"a": "trunc', {"a": "trunc"}),
    ('{"a": 1, "b"', {"a": 1}),
    ('{"a": 1, "b":', {"a": 1, "b": None}),
    ('{"a": True, "b": False, "c": None}', {"a": True, "b": False, "c": None}),
    ('{"a": "True story", "b": "None of it", \'c\': \'False\'}',
     {"a": "True story", "b": "None of it", "c": "False"}),
    ('{"a": [True, None]} and then prose', {"a": [True, None]}),
    ('{name: "f", arguments: {x: 1}}', {"name": "f", "arguments": {"x": 1}}),
    ('{städte: ["Köln"], é: 1}', {"städte": ["Köln"], "é": 1}),  # non-ASCII bare keys
    ('{"s": "line1\nline2"}', {"s": "line1\nline2"}),
    ('{"code": "```json\\n{}\\n```"}', {"code": "```json\n{}\n```"}),
    ('{"a": "x {not json"', {"a": "x {not json"}),
])
def test_repair_json(text, want):
    assert repair_json(text) == want


@pytest.mark.parametrize("text", ["", "no braces at all", "```\nplain\n```", None])
def test_repair_json_gives_up(text):
    assert repair_json(text) is None


# ------------------------------------------------------------------- envelope

@pytest.mark.parametrize("obj,want", [
    ({"name": "f", "arguments": {"x": 1}}, ("f", {"x": 1})),
    ({"name": "f", "parameters": {"x": 1}}, ("f", {"x": 1})),
    ({"name": "f", "arguments": '{"x": 1}'}, ("f", {"x": 1})),
    ({"name": "f", "arguments": "{'x': True}"}, ("f", {"x": True})),
    ({"name": "f"}, ("f", {})),
    ({"name": "f", "arguments": ""}, ("f", {})),
    ({"type": "function", "function": {"name": "f", "arguments": "{}"}}, ("f", {})),
    ({"arguments": {"name": "f", "x": 1}}, ("f", {"x": 1})),
    ({"arguments": {"name": "f", "arguments": {"x": 1}}}, ("f", {"x": 1})),
    ({"name": "f", "arguments": {"name": "f", "arguments": {"x": 1}}}, ("f", {"x": 1})),
    ({"name": "f", "arguments": {"name": "keep", "x": 1}}, ("f", {"name": "keep", "x": 1})),
    ({"name": {"name": "f", "arguments": {"x": 1}}}, ("f", {"x": 1})),
    ({"function": "f", "arguments": {"x": 1}}, ("f", {"x": 1})),
])
def test_normalize_call(obj, want):
    assert normalize_call(obj) == want


@pytest.mark.parametrize("obj", [None, [], "f", {"arguments": {"x": 1}}, {"name": ""},
                                 {"name": "f", "arguments": "not json"},
                                 {"name": "f", "arguments": [1]}])
def test_normalize_call_rejects(obj):
    assert normalize_call(obj) is None


# ------------------------------------------------------------------- coercion

SCHEMA = {"type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
    "b": {"type": "boolean"}, "a": {"type": "array"}, "o": {"type": "object"},
    "opt": {"type": ["integer", "null"]},
    "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "e": {"enum": [1, 2]}}}


@pytest.mark.parametrize("key,raw,want", [
    ("s", "007", "007"), ("s", " spaced \n", " spaced \n"), ("s", "true", "true"),
    ("s", 7, "7"), ("s", True, "true"), ("s", {"k": 1}, '{"k": 1}'),
    ("i", "42", 42), ("i", " 42\n", 42), ("i", "007", "007"), ("i", "4.0", 4), ("i", "abc", "abc"),
    ("n", "1.5", 1.5), ("n", "-3", -3),
    ("b", "true", True), ("b", "False", False), ("b", "True", True), ("b", "yes", "yes"),
    ("a", '[1, "x"]', [1, "x"]), ("a", "[True, None]", [True, None]), ("a", "[1, 2", [1, 2]),
    ("a", "not a list", "not a list"), ("a", [1], [1]),
    ("o", '{"k": "v"}', {"k": "v"}), ("o", "{'k': False}", {"k": False}), ("o", "[1]", "[1]"),
    ("opt", "null", None), ("opt", "None", None), ("opt", "5", 5),
    ("any", "42", "42"), ("e", "2", 2),
    ("unknown", "42", "42"), ("unknown", '{"k": 1}', {"k": 1}), ("unknown", 3, 3),
])
def test_coerce_arguments(key, raw, want):
    assert coerce_arguments({key: raw}, SCHEMA) == {key: want}


def test_coerce_accepts_properties_map_and_none():
    assert coerce_arguments({"i": "3"}, SCHEMA["properties"]) == {"i": 3}
    assert coerce_arguments({"i": "3"}, None) == {"i": "3"}


def test_find_tool_and_params_both_shapes():
    assert find_tool(TOOLS, "get_weather")["name"] == "get_weather"
    assert tool_params(TOOLS, "flat")["properties"]["x"]["type"] == "number"
    assert find_tool(TOOLS, "nope") is None and find_tool(None, "x") is None


def test_make_call_uses_schema_and_keeps_id():
    tc = make_call("get_weather", {"zip": "007", "days": "3", "metric": "True"}, TOOLS, id="abc")
    assert tc.args == {"zip": "007", "days": 3, "metric": True} and tc.id == "abc"


# ---------------------------------------------------------------- JsonDialect

@pytest.mark.parametrize("inner,want", [
    ('{"name": "get_weather", "arguments": {"city": "P"}}', [("get_weather", {"city": "P"})]),
    ('[{"name": "a"}, {"name": "b", "arguments": {"x": 1}}]', [("a", {}), ("b", {"x": 1})]),
    ('{"name": "a"}\n{"name": "b"}', [("a", {}), ("b", {})]),
    ('{"tool_calls": [{"function": {"name": "a", "arguments": "{}"}}]}', [("a", {})]),
    ('```json\n{"name": "get_weather", "arguments": {"metric": True,}}\n```',
     [("get_weather", {"metric": True})]),
    ("{'name': 'get_weather', 'arguments': {'days': '2'}}", [("get_weather", {"days": 2})]),
    ('{"arguments": {"name": "get_weather", "city": "Oslo"}}', [("get_weather", {"city": "Oslo"})]),
])
def test_json_dialect_parse(inner, want):
    calls = JsonDialect().parse("<tool_call>" + inner + "</tool_call>", TOOLS)
    assert [(c.name, c.args) for c in calls] == want


@pytest.mark.parametrize("inner", ["", "hello", '{"no_name": 1}', '[{"name": "a"}, 3]'])
def test_json_dialect_rejects(inner):
    assert JsonDialect().parse("<tool_call>" + inner + "</tool_call>", TOOLS) is None


def test_json_dialect_keeps_model_id():
    (tc,) = JsonDialect().parse('<tool_call>{"id": "x1", "name": "a"}</tool_call>', None)
    assert tc.id == "x1"


# ------------------------------------------------------------- template map

def test_dialect_for_parser_names():
    assert isinstance(dialect_for_parser("json_tools"), JsonDialect)
    assert dialect_for_parser(None) is None and dialect_for_parser("no_such_parser") is None


def test_dialect_follows_mlx_lm_tokenizer_inference():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    chatml = tiny_checkpoint("qwen3")  # plain ChatML template: mlx-lm infers no parser
    assert dialect_for_tokenizer(load_tokenizer(chatml)) is None
    qwen = tiny_checkpoint("qwen3",
                           chat_template="{% for m in messages %}{{ m.content }}{% endfor %}"
                                         "<tool_call>\n<function=x>")
    d = dialect_for_tokenizer(load_tokenizer(qwen))
    assert isinstance(d, MlxLmDialect) and d.name == "qwen3_coder"


def test_mlx_lm_adapter_wraps_parser_module():
    d = dialect_for_parser("glm47")
    assert isinstance(d, MlxLmDialect) and d.starts == ("<tool_call>",)
    text = "Hi<tool_call>get_weather<arg_key>zip</arg_key><arg_value>007</arg_value></tool_call>"
    ev = events_all_chunkings(lambda: StreamingToolParser(d, TOOLS), text)
    assert ev == [("content", "Hi"), call("get_weather", zip="007")]


def test_mlx_lm_adapter_failure_is_content():
    class Mod:
        tool_call_start, tool_call_end = "<c>", ""

        @staticmethod
        def parse_tool_call(text, tools):
            raise ValueError("nope")

    d = MlxLmDialect("fake", Mod)
    assert d.end is None  # "" end = runs to EOS
    assert run_chunks(lambda: StreamingToolParser(d), ["a <c>zz"]) == [("content", "a <c>zz")]


def test_long_markup_body_is_linear():
    import time
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "' + "abcd " * 60000
            + '"}}</tool_call>')
    p, t0, ev = P()(), time.time(), []
    for i in range(0, len(text), 4):
        ev += p.feed(text[i:i + 4])
    assert ev[-1].kind == "tool_call" and time.time() - t0 < 5
