"""Qwen3.5 XML tool-call dialect."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest
from mlxbun_qwen35.toolcalls import QwenDialect, make_parser, unframe

from mlxbun_core.toolcalls.testing import events_all_chunkings

TOOLS = [{"type": "function", "function": {"name": "edit", "parameters": {
    "type": "object", "properties": {
        "path": {"type": "string"}, "new": {"type": "string"}, "zip": {"type": "string"},
        "edits": {"type": "array"}, "opts": {"type": "object"}, "line": {"type": "integer"},
        "force": {"type": "boolean"}}}}}]


def ev(text, tools=TOOLS):
    return events_all_chunkings(lambda: make_parser(tools), text)


def xml(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_basic_with_content_before_and_after():
    text = "Editing now.\n\n" + xml("edit", path="a.py", line="12", force="true") + "\nok"
    assert ev(text) == [("content", "Editing now."),
                        ("tool_call", "edit", {"path": "a.py", "line": 12, "force": True}),
                        ("content", "\nok")]


def test_raw_values_entities_indentation_escapes_preserved():
    new = '    if a &lt; b &amp;&amp; c:\n        print("x\\ty\\n")\n\n'
    (_, name, args), = ev(xml("edit", new=new))
    assert args["new"] == new  # only the single framing newline at each end removed


def test_only_one_framing_newline_removed():
    assert unframe("\n\nx\n\n") == "\nx\n"
    assert unframe("x") == "x" and unframe("\r\nx\r\n") == "x"


def test_string_param_stays_string():
    (_, _, args), = ev(xml("edit", zip="007", path="true"))
    assert args == {"zip": "007", "path": "true"}


def test_nested_edit_array_not_mistaken_for_envelope():
    edits = '[{"name": "other", "arguments": {"old": "a", "new": "b"}}]'
    (_, name, args), = ev(xml("edit", path="f", edits=edits))
    assert name == "edit"
    assert args["edits"] == [{"name": "other", "arguments": {"old": "a", "new": "b"}}]


def test_python_booleans_in_array_and_bool_param():
    (_, _, args), = ev(xml("edit", edits='[{"all": True, "x": None}]', force="False",
                           opts="{'dry': True}"))
    assert args == {"edits": [{"all": True, "x": None}], "force": False, "opts": {"dry": True}}


def test_undecodable_array_falls_back_to_raw_string():
    (_, _, args), = ev(xml("edit", edits="not json"))
    assert args == {"edits": "not json"}


def test_multiple_calls_back_to_back_and_in_one_block():
    two = xml("edit", path="a") + "\n" + xml("edit", path="b")
    assert [e[2] for e in ev(two)] == [{"path": "a"}, {"path": "b"}]
    one_block = ("<tool_call>\n<function=edit>\n<parameter=path>\na\n</parameter>\n</function>\n"
                 "<function=edit>\n<parameter=path>\nb\n</parameter>\n</function>\n</tool_call>")
    assert [e[2] for e in ev(one_block)] == [{"path": "a"}, {"path": "b"}]


def test_truncated_missing_end_tags():
    text = ("<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n"
            "<parameter=new>\nline1\n")
    (tc,) = QwenDialect().parse(text, TOOLS)
    assert (tc.name, tc.args) == ("edit", {"path": "a.py", "new": "line1"})
    assert ev(text) == []  # cut inside a parameter: never a call on the stream
    text2 = "<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n</function>"
    # whole: only </tool_call> missing
    assert ev(text2) == [("tool_call", "edit", {"path": "a.py"})]
    assert events_all_chunkings(lambda: make_parser(TOOLS), text2, cut=True) == []


def test_missing_parameter_close_before_function_close():
    text = "<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</function>\n</tool_call>"
    assert ev(text) == [("tool_call", "edit", {"path": "a.py"})]


def test_bare_function_without_tool_call_wrapper():
    text = "ok <function=edit>\n<parameter=path>\nx\n</parameter>\n</function> done"
    assert ev(text) == [("content", "ok"), ("tool_call", "edit", {"path": "x"}),
                        ("content", " done")]


def test_no_params():
    assert ev("<tool_call>\n<function=ping>\n</function>\n</tool_call>") == [
        ("tool_call", "ping", {})]


def test_json_fallback_inside_tool_call():
    text = '<tool_call>\n{"name": "edit", "arguments": {"line": "3", "force": True}}\n</tool_call>'
    assert ev(text) == [("tool_call", "edit", {"line": 3, "force": True})]


@pytest.mark.parametrize("text", ["<tool_call>\nwhatever\n</tool_call>",
                                  "<tool_call>\n<function=>\n</function></tool_call>"])
def test_garbage_is_content(text):
    assert ev(text) == [("content", text)]


def test_keepalive_on_large_body():
    text = xml("edit", new="z" * 1000)
    out = ev(text)
    assert out[-1] == ("tool_call", "edit", {"new": "z" * 1000})
    assert out[:-1] == [("keepalive",)] * ((len(text) - 1) // 256)


def test_dialect_direct():
    (tc,) = QwenDialect().parse(xml("edit", line="5"), TOOLS)
    assert tc.name == "edit" and tc.arguments == '{"line": 5}'
