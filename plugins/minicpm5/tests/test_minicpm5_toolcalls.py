"""MiniCPM5 <function name=…><param name=…> tool-call dialect."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest
from mlxbun_minicpm5.toolcalls import MiniCPM5Dialect, make_parser

from mlxbun_core.toolcalls.testing import events_all_chunkings

TOOLS = [{"type": "function", "function": {"name": "write", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "body": {"type": "string"},
                                     "zip": {"type": "string"}, "n": {"type": "integer"},
                                     "tags": {"type": "array"}, "force": {"type": "boolean"}}}}}]


def ev(text, tools=TOOLS):
    return events_all_chunkings(lambda: make_parser(tools), text)


def test_basic_call_with_content():
    text = ('Writing.\n<function name="write"><param name="path">a.txt</param>'
            '<param name="n">3</param></function>')
    assert ev(text) == [("content", "Writing."), ("tool_call", "write", {"path": "a.txt", "n": 3})]


def test_cdata_value_verbatim_even_with_tags():
    body = "\n  <div a=\"1\">x &amp; y</div></function></param>\n"
    text = f'<function name="write"><param name="body"><![CDATA[{body}]]></param></function>'
    assert ev(text) == [("tool_call", "write", {"body": body})]


def test_split_cdata_sections_joined():
    text = ('<function name="write"><param name="body"><![CDATA[a]]]]><![CDATA[>b]]></param>'
            '</function>')
    assert ev(text) == [("tool_call", "write", {"body": "a]]>b"})]


def test_string_params_stay_strings_and_types_decoded():
    text = ('<function name="write"><param name="zip">007</param><param name="force">True</param>'
            '<param name="tags">["a", "b"]</param></function>')
    assert ev(text) == [("tool_call", "write", {"zip": "007", "force": True, "tags": ["a", "b"]})]


def test_parallel_calls_and_single_quotes():
    text = ("<function name='write'><param name='n'>1</param></function>\n"
            '<function name="write"><param name="n">2</param></function>')
    assert [e[2] for e in ev(text)] == [{"n": 1}, {"n": 2}]


def test_truncated_cdata_and_missing_end():
    text = ('<function name="write"><param name="path">p</param>'
            '<param name="body"><![CDATA[partial <x>')
    (tc,) = MiniCPM5Dialect().parse(text, TOOLS)
    assert (tc.name, tc.args) == ("write", {"path": "p", "body": "partial <x>"})
    text2 = '<function name="write"><param name="n">5'
    (tc,) = MiniCPM5Dialect().parse(text2, TOOLS)
    assert (tc.name, tc.args) == ("write", {"n": 5})
    assert ev(text) == ev(text2) == []  # an unclosed block is never a call on the stream


def test_no_params():
    assert ev('<function name="ping"></function>', None) == [("tool_call", "ping", {})]


@pytest.mark.parametrize("text", ['<function name=>x</function>', '<function name="">x</function>'])
def test_garbage_is_content(text):
    assert ev(text) == [("content", text)]


def test_dialect_direct():
    (tc,) = MiniCPM5Dialect().parse('<function name="write"><param name="n">7</param></function>',
                                    TOOLS)
    assert tc.arguments == '{"n": 7}'


def test_shared_dialect_instance_interleaved_parsers():
    from mlxbun_core.toolcalls import StreamingToolParser
    d = MiniCPM5Dialect()
    a, b = StreamingToolParser(d, TOOLS), StreamingToolParser(d, TOOLS)
    ta = '<function name="write"><param name="body"><![CDATA[x</function>y]]></param></function>'
    tb = '<function name="write"><param name="n">4</param></function>'
    out = {id(a): [], id(b): []}
    for i in range(max(len(ta), len(tb))):
        out[id(a)] += a.feed(ta[i:i + 1])
        out[id(b)] += b.feed(tb[i:i + 1])
    calls = {k: [e for e in v if e.kind == "tool_call"] for k, v in out.items()}  # streamed too
    assert [json_args(e) for e in calls[id(a)]] == [{"body": "x</function>y"}]
    assert [json_args(e) for e in calls[id(b)]] == [{"n": 4}]


def json_args(event):
    return event.call.args


def test_long_cdata_body_is_linear():
    import time
    text = ('<function name="write"><param name="body"><![CDATA['
            + "ab</function>\n" * 20000 + "]]></param></function>")
    p, t0, ev = make_parser(TOOLS), time.time(), []
    for i in range(0, len(text), 4):
        ev += p.feed(text[i:i + 4])
    assert ev[-1].kind == "tool_call" and time.time() - t0 < 5


@pytest.mark.parametrize("markup", [
    '<function name="write"><param name="path">a.txt</param><param name="n">3</param>'
    '<param name="tags">["a", "b"]</param><param name="force">true</param></function>',
    '<function name="write"><param name="zip">007</param>'
    '<param name="body"><![CDATA[x < y && z\n]]></param></function>',
])
def test_agrees_with_mlx_lm_minicpm5_parser(markup):
    from mlx_lm.tool_parsers.minicpm5 import parse_tool_call

    want = parse_tool_call(markup, TOOLS)
    assert ev(markup) == [("tool_call", want["name"], want["arguments"])]
