"""Qwen3.5/Qwen3-Coder tool calls::

    <tool_call>
    <function=name>
    <parameter=key>
    value
    </parameter>
    </function>
    </tool_call>

Values are raw text: entities, indentation and JSON escapes are preserved and only
one framing newline is removed at each end; the schema then decodes non-string
params. The XML envelope is parsed first, so JSON inside a parameter (e.g. an edit
array with "name" keys) is never mistaken for the call envelope. JSON inside
``<tool_call>`` is accepted as a fallback, and a bare ``<function=…>`` block
without the outer tag is accepted too (Qwen3.5 sometimes drops it)."""

from __future__ import annotations

import re

from mlxbun_core.grammar import structural as S
from mlxbun_core.toolcalls import Dialect, StreamingToolParser, ToolCall, calls_from_json, make_call
from mlxbun_core.toolcalls.element_scan import ElementScanner
from mlxbun_core.toolcalls.grammar import ArgMarkup, element_args, tool_schemas

_FN = re.compile(r"<function=([^>\n]*)>")
_HEAD = re.compile(r"(?:<tool_call>\s*)?<function=([^>\n]*)>")
_KEY = re.compile(r"<parameter=([^>]*)>")
_P_OPEN, _P_CLOSE, _F_CLOSE = "<parameter=", "</parameter>", "</function>"


def unframe(raw: str) -> str:
    """Drop exactly one framing newline at each end."""
    if raw.startswith("\r\n"):
        raw = raw[2:]
    elif raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\r\n"):
        raw = raw[:-2]
    elif raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def _name(s: str) -> str:
    return s.strip().strip("\"'")


def parse_xml(text: str, tools: list | None) -> list[ToolCall] | None:
    """Every ``<function=…>`` block in ``text``; tolerant of missing close tags."""
    calls, pos, n = [], 0, len(text)
    while m := _FN.search(text, pos):
        name, args, i = _name(m.group(1)), {}, m.end()
        while True:
            j = i
            while j < n and text[j].isspace():
                j += 1
            if text.startswith(_P_OPEN, j):
                k = text.find(">", j)
                if k < 0:
                    i = n
                    break
                e = text.find(_P_CLOSE, k + 1)
                if e < 0:  # truncated value: runs to EOS (minus closing tags)
                    raw = text[k + 1:]
                    f = raw.rfind(_F_CLOSE)
                    raw, i = (raw if f < 0 else raw[:f]), n
                else:
                    raw, i = text[k + 1:e], e + len(_P_CLOSE)
                args[_name(text[j + len(_P_OPEN):k])] = unframe(raw)
                if e < 0:
                    break
            else:
                i = j + len(_F_CLOSE) if text.startswith(_F_CLOSE, j) else j
                break
        if not name:
            return None
        calls.append(make_call(name, args, tools))
        pos = i
    return calls or None


class QwenDialect(Dialect):
    starts = ("<tool_call>", "<function=")

    def end_for(self, start: str) -> str:
        return "</tool_call>" if start == "<tool_call>" else _F_CLOSE

    def call_grammar(self, tools: list) -> dict:
        """One ``<tool_call>`` block as the template writes it: a parameter per line,
        string values raw, other values JSON."""
        markup = ArgMarkup("<parameter=", ">\n", _P_CLOSE, pad="\n", after="\n",
                           name_regex=r"[^>\n]+")
        fns = [S.seq(S.const(f"\n<function={name}>\n"), element_args(params, markup),
                     S.const("</function>\n")) for name, params in tool_schemas(tools)]
        return S.tag("<tool_call>", S.alt(*fns), "</tool_call>")

    def scanner(self) -> ElementScanner:
        """The first function of a block streams: each parameter's value as written
        (one framing newline dropped at each end, as :func:`unframe` does)."""
        return ElementScanner(_HEAD, _KEY, _P_OPEN, _P_CLOSE, trim="unframe",
                              call_end=_F_CLOSE, clean=_name)

    def whole_at_eos(self, markup: str) -> bool:
        """Every function closed; only ``</tool_call>`` is missing."""
        return markup.startswith("<tool_call>") and markup.rstrip().endswith(_F_CLOSE)

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        if markup.startswith("<function="):
            return parse_xml(markup, tools)
        inner = self.inner(markup)
        if _FN.search(inner):
            return parse_xml(inner, tools)
        return calls_from_json(inner, tools)


def make_parser(tools: list | None) -> StreamingToolParser:
    return StreamingToolParser(QwenDialect(), tools)
