"""GLM arg_key/arg_value tool-call dialect."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest
from mlxbun_glm52.toolcalls import GlmDialect, make_parser

from mlxbun_core.toolcalls.testing import events_all_chunkings

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}, "zip": {"type": "string"},
                                     "n": {"type": "integer"}, "flags": {"type": "array"},
                                     "dry": {"type": "boolean"}}}}}]


def ev(text, tools=TOOLS):
    return events_all_chunkings(lambda: make_parser(tools), text)


def kv(k, v):
    return f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"


def test_basic_call():
    text = ("Running.\n<tool_call>run\n" + kv("cmd", "ls -la") + kv("n", "3") + kv("dry", "true")
            + "</tool_call>")
    assert ev(text) == [("content", "Running."),
                        ("tool_call", "run", {"cmd": "ls -la", "n": 3, "dry": True})]


def test_string_values_raw_and_string_typed():
    code = "  line1\n    line2 &amp; <b>\n"
    text = "<tool_call>run" + kv("cmd", code) + kv("zip", "007") + "</tool_call>"
    assert ev(text) == [("tool_call", "run", {"cmd": code, "zip": "007"})]


def test_json_array_and_python_booleans():
    text = "<tool_call>run" + kv("flags", '["-a", True]') + kv("dry", "False") + "</tool_call>"
    assert ev(text) == [("tool_call", "run", {"flags": ["-a", True], "dry": False})]


def test_multiple_calls():
    one = "<tool_call>run" + kv("n", "{}") + "</tool_call>"
    assert [e[2] for e in ev(one.format(1) + "\n" + one.format(2))] == [{"n": 1}, {"n": 2}]


def test_no_args_call():
    assert ev("<tool_call>ping</tool_call>", None) == [("tool_call", "ping", {})]


def test_truncated_value_and_missing_end_tag():
    text = "<tool_call>run" + kv("n", "5") + "<arg_key>cmd</arg_key><arg_value>echo hi"
    (tc,) = GlmDialect().parse(text, TOOLS)
    assert (tc.name, tc.args) == ("run", {"n": 5, "cmd": "echo hi"})
    assert ev(text) == []  # an unclosed block is never a call on the stream


def test_json_fallbacks():
    assert ev('<tool_call>{"name": "run", "arguments": {"n": "4"}}</tool_call>') == [
        ("tool_call", "run", {"n": 4})]
    assert ev('<tool_call>run\n{"n": 4, "dry": True}</tool_call>') == [
        ("tool_call", "run", {"n": 4, "dry": True})]


@pytest.mark.parametrize("text", ["<tool_call>this is prose, not a call</tool_call>",
                                  "<tool_call></tool_call>",
                                  "<tool_call>bad name<arg_key>a</arg_key></tool_call>"])
def test_garbage_is_content(text):
    assert ev(text) == [("content", text)]


def test_dialect_direct():
    (tc,) = GlmDialect().parse("<tool_call>run" + kv("n", "9") + "</tool_call>", TOOLS)
    assert tc.name == "run" and tc.arguments == '{"n": 9}'


@pytest.mark.parametrize("inner", [
    "run\n" + kv("cmd", "ls -la") + kv("n", "3") + kv("flags", '["-a", "-l"]') + kv("dry", "false"),
    "run<arg_key>zip</arg_key><arg_value>007</arg_value><arg_key>n</arg_key><arg_value>12</arg_value>",
])
def test_agrees_with_mlx_lm_glm47_parser(inner):
    from mlx_lm.tool_parsers.glm47 import parse_tool_call

    want = parse_tool_call(inner, TOOLS)
    assert ev(f"<tool_call>{inner}</tool_call>") == [("tool_call", want["name"], want["arguments"])]
