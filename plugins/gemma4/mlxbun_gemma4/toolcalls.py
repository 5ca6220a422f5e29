"""Gemma 4 tool calls: ``<|tool_call>call:name{key:<|"|>text<|"|>,n:42}<tool_call|>``.

Same syntax as mlx_lm/tool_parsers/gemma4.py (bare keys, ``<|"|>`` string
delimiters, JSON scalars), but scanned by hand so truncated calls (no closing
brace/sentinel at EOS) are repaired instead of dropped."""

from __future__ import annotations

import json
import re

from mlxbun_core.grammar import structural as S
from mlxbun_core.grammar.schema import json_types, resolve, with_defs
from mlxbun_core.toolcalls import Dialect, StreamingToolParser, ToolCall, make_call, repair_json
from mlxbun_core.toolcalls.grammar import raw_string, string_only, tool_schemas

STR = '<|"|>'
_CALL = re.compile(r"call:([\w.\-]+)")


def args_to_json(s: str, i: int) -> tuple[str, int]:
    """Gemma args starting at ``s[i] == "{"`` → JSON-ish text (bare keys left for
    repair_json) and the offset past the balanced close (len(s) if truncated)."""
    out, depth, n = [], 0, len(s)
    while i < n:
        if s.startswith(STR, i):
            e = s.find(STR, i + len(STR))
            out.append(json.dumps(s[i + len(STR): e if e >= 0 else n], ensure_ascii=False))
            i = n if e < 0 else e + len(STR)
            continue
        c = s[i]
        out.append(c)
        i += 1
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                break
    return "".join(out), i


def parse_calls(text: str, tools: list | None) -> list[ToolCall] | None:
    calls, pos = [], 0
    while m := _CALL.search(text, pos):
        j = m.end()
        if j < len(text) and text[j] == "{":
            js, pos = args_to_json(text, j)
            args = repair_json(js)
            if not isinstance(args, dict):
                return None
        elif text[j:].strip() in ("", "<tool_call|>"):  # truncated right after the name
            args, pos = {}, len(text)
        else:
            return None
        calls.append(make_call(m.group(1), args, tools))
    return calls or None


def value_grammar(schema, root: dict) -> dict:
    """A value: strings between ``<|"|>`` sentinels, anything else as JSON (which
    :func:`parse_calls` reads too; nested strings then keep JSON quotes)."""
    if string_only(schema, root):
        return S.seq(S.const(STR), raw_string(schema, root, STR))
    if not json_types(schema, root):
        return S.alt(S.seq(S.const(STR), S.tag("", S.any_text(), STR)),
                     S.json_value(with_defs(schema, root)))
    return S.json_value(with_defs(schema, root))


def args_grammar(params: dict) -> dict:
    """``{k:v,…}`` with keys sorted (as the template writes them); optional keys may
    be left out, so the commas are placed around the keys actually written."""
    root = params if isinstance(params, dict) else {}
    props = root.get("properties")
    if not isinstance(props, dict):
        props = {}
    required = set(root.get("required") or ()) if isinstance(root.get("required"), list) else set()
    items = [(S.seq(S.const(f"{k}:"), value_grammar(props[k], root)), k in required)
             for k in sorted(props)]
    extra = resolve(root.get("additionalProperties", not props and "properties" not in root), root)
    if extra is True or isinstance(extra, dict):  # free arguments: any text up to the end
        return S.seq(S.const("{"), S.any_text())
    first = next((i for i, (_, req) in enumerate(items) if req), None)
    if first is None:  # all optional: any one of them may come first, or none
        body = S.opt(S.alt(*[_after(items, j) for j in range(len(items))])) if items else \
            S.const("")
    else:
        body = S.seq(*[S.opt(S.seq(x, S.const(","))) for x, _ in items[:first]],
                     _after(items, first))
    return S.seq(S.const("{"), body, S.const("}"))


def _after(items: list, j: int) -> dict:
    """Item ``j`` written, then the later ones, each after a comma."""
    rest = [S.seq(S.const(","), x) if req else S.opt(S.seq(S.const(","), x))
            for x, req in items[j + 1:]]
    return S.seq(items[j][0], *rest)


class Gemma4Dialect(Dialect):
    starts = ("<|tool_call>",)
    end = "<tool_call|>"

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        return parse_calls(self.inner(markup), tools)

    def call_grammar(self, tools: list) -> dict:
        """``<|tool_call>call:name{k:v,…}<tool_call|>``."""
        fns = [S.seq(S.const(f"call:{name}"), args_grammar(params))
               for name, params in tool_schemas(tools)]
        return S.tag(self.starts[0], S.alt(*fns), self.end)


def make_parser(tools: list | None) -> StreamingToolParser:
    return StreamingToolParser(Gemma4Dialect(), tools)
