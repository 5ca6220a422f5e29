"""GLM tool calls: ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>``
(mlx_lm/tool_parsers/glm47.py). The template writes string values raw and others as
JSON, so values stay raw here and the tool schema decides (string params verbatim).
Fallbacks: a bare ``name`` (no args) and JSON inside the tags."""

from __future__ import annotations

import re

from mlxbun_core.grammar import structural as S
from mlxbun_core.toolcalls import (
    Dialect,
    StreamingToolParser,
    ToolCall,
    calls_from_json,
    make_call,
    repair_json,
)
from mlxbun_core.toolcalls.element_scan import ElementScanner
from mlxbun_core.toolcalls.grammar import ArgMarkup, element_args, tool_schemas

_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)(?:</arg_value>|\Z)", re.S)
_NAME = re.compile(r"[\w.\-:/]+")
_HEAD = re.compile(r"<tool_call>\s*([\w.\-:/]+)\s*(?=<arg_key>)")
_KEY = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>", re.S)


def parse_call(inner: str, tools: list | None) -> list[ToolCall] | None:
    k = inner.find("<arg_key>")
    if k < 0:
        s = inner.strip()
        if not s:
            return None
        if s[0] in "{[":
            return calls_from_json(s, tools)
        head, _, rest = s.partition("\n")
        head = head.strip()
        if _NAME.fullmatch(head):
            if not rest.strip():
                return [make_call(head, {}, tools)]
            args = repair_json(rest)  # "name\n{json}"
            if isinstance(args, dict):
                return [make_call(head, args, tools)]
        return None
    name = inner[:k].strip()
    if not _NAME.fullmatch(name):
        return None
    args = {m.group(1).strip(): m.group(2) for m in _ARG.finditer(inner, k)}
    return [make_call(name, args, tools)]


class GlmDialect(Dialect):
    starts = ("<tool_call>",)
    end = "</tool_call>"

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        return parse_call(self.inner(markup), tools)

    def scanner(self) -> ElementScanner:
        """The name streams once the first ``<arg_key>`` follows it, then each value
        as written (raw, as the whole parse keeps it)."""
        return ElementScanner(_HEAD, _KEY, "<arg_key>", "</arg_value>")

    def call_grammar(self, tools: list) -> dict:
        """``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>``:
        string values raw, other values JSON (as the template writes them)."""
        markup = ArgMarkup("<arg_key>", "</arg_key><arg_value>", "</arg_value>",
                           name_regex=r"[^<]+")
        fns = [S.seq(S.const(name), element_args(params, markup))
               for name, params in tool_schemas(tools)]
        return S.tag("<tool_call>", S.alt(*fns), "</tool_call>")


def make_parser(tools: list | None) -> StreamingToolParser:
    return StreamingToolParser(GlmDialect(), tools)
