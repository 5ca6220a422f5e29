"""Gemma 4 sentinel tool-call dialect."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest
from mlxbun_gemma4.toolcalls import Gemma4Dialect, make_parser

from mlxbun_core.toolcalls.testing import events_all_chunkings

Q = '<|"|>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"},
                                     "days": {"type": "integer"}}}}}]


def ev(text, tools=TOOLS):
    return events_all_chunkings(lambda: make_parser(tools), text)


def test_basic_call_with_content():
    text = f"Checking.<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>"
    assert ev(text) == [("content", "Checking."),
                        ("tool_call", "get_weather", {"city": "Paris", "days": 3})]


def test_nested_values_and_strings_with_braces_commas_quotes():
    s = 'a, {b}: "c" \\n'
    text = (f"<|tool_call>call:f{{s:{Q}{s}{Q},l:[1,{Q}x{Q},true],o:{{k:{Q}v{Q},n:null}},"
            f"neg:-1.5,b:false}}<tool_call|>")
    assert ev(text, None) == [("tool_call", "f", {"s": s, "l": [1, "x", True],
                                                  "o": {"k": "v", "n": None}, "neg": -1.5,
                                                  "b": False})]


def test_string_param_stays_string():
    text = f"<|tool_call>call:get_weather{{zip:{Q}007{Q},city:{Q}true{Q}}}<tool_call|>"
    assert ev(text) == [("tool_call", "get_weather", {"zip": "007", "city": "true"})]


def test_number_for_string_param_kept_as_text():
    assert ev("<|tool_call>call:get_weather{zip:7}<tool_call|>") == [
        ("tool_call", "get_weather", {"zip": "7"})]


def test_multiple_calls_separate_and_in_one_block():
    a = f"<|tool_call>call:get_weather{{city:{Q}A{Q}}}<tool_call|>"
    b = f"<|tool_call>call:get_weather{{city:{Q}B{Q}}}<tool_call|>"
    assert [e[2] for e in ev(a + b)] == [{"city": "A"}, {"city": "B"}]
    both = (f"<|tool_call>call:get_weather{{city:{Q}A{Q}}}"
            f"call:get_weather{{city:{Q}B{Q}}}<tool_call|>")
    assert [e[2] for e in ev(both)] == [{"city": "A"}, {"city": "B"}]


def test_empty_args():
    assert ev("<|tool_call>call:ping{}<tool_call|>", None) == [("tool_call", "ping", {})]


@pytest.mark.parametrize("text,args", [
    (f"<|tool_call>call:get_weather{{city:{Q}Par", {"city": "Par"}),
    (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3", {"city": "Paris", "days": 3}),
    (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}", {"city": "Paris"}),
    ("<|tool_call>call:get_weather", {}),
])
def test_truncated_repaired(text, args):
    """The dialect's parser reads a truncated block; the stream never makes it a call."""
    (tc,) = Gemma4Dialect().parse(text, TOOLS)
    assert (tc.name, tc.args) == ("get_weather", args)
    assert ev(text) == []


def test_python_booleans_repaired():
    assert ev("<|tool_call>call:f{a:True,b:None}<tool_call|>", None) == [
        ("tool_call", "f", {"a": True, "b": None})]


@pytest.mark.parametrize("text", ["<|tool_call>hello<tool_call|>",
                                  "<|tool_call>call:f oops<tool_call|>"])
def test_garbage_is_content(text):
    assert ev(text) == [("content", text)]


def test_dialect_direct():
    (tc,) = Gemma4Dialect().parse(f"<|tool_call>call:get_weather{{days:{Q}2{Q}}}<tool_call|>",
                                  TOOLS)
    assert tc.arguments == '{"days": 2}'


# -- real markup samples, cross-checked against mlx-lm's own Gemma 4 parser ------------

REAL = [
    f"<|tool_call>call:get_weather{{city:{Q}San Francisco, CA{Q},days:7}}<tool_call|>",
    f"<|tool_call>call:search{{filters:{{lang:[{Q}en{Q},{Q}fr{Q}],safe:true}},"
    f"query:{Q}a <b> {{c}}{Q}}}<tool_call|>",
    f"<|tool_call>call:write_file{{content:{Q}line 1\n  line 2\n{Q},"
    f"path:{Q}/tmp/x.py{Q}}}<tool_call|>",
    "<|tool_call>call:get-time{}<tool_call|>",
]


@pytest.mark.parametrize("text", REAL)
def test_matches_mlx_lm_parser(text):
    from mlx_lm.tool_parsers import gemma4 as ref

    want = ref.parse_tool_call(text[len(ref.tool_call_start):-len(ref.tool_call_end)])
    (got,) = [e for e in ev(text, None) if e[0] == "tool_call"]
    assert (got[1], got[2]) == (want["name"], want["arguments"])


def test_content_around_calls_and_handover_token():
    # as generated after a thought channel: prose, two calls, then the turn is handed over
    text = (f"I'll check both.<|tool_call>call:get_weather{{city:{Q}A{Q}}}<tool_call|>"
            f"<|tool_call>call:get_weather{{city:{Q}B{Q}}}<tool_call|>")
    assert ev(text) == [("content", "I'll check both."),
                        ("tool_call", "get_weather", {"city": "A"}),
                        ("tool_call", "get_weather", {"city": "B"})]


def test_lookalike_text_is_content():
    text = "Use call:get_weather{city:x} in prose, or <|tool without a call."
    assert ev(text) == [("content", text)]
