"""Gemma 4 tool calls: ``<|tool_call>call:name{key:<|"|>text<|"|>,n:42}<tool_call|>``.

Same syntax as mlx_lm/tool_parsers/gemma4.py (bare keys, ``<|"|>`` string
delimiters, JSON scalars), but scanned by hand so truncated calls (no closing
brace/sentinel at EOS) are repaired instead of dropped."""

from __future__ import annotations

import json
import re

from mlxbun_core.toolcalls import Dialect, StreamingToolParser, ToolCall, make_call, repair_json

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


class Gemma4Dialect(Dialect):
    starts = ("<|tool_call>",)
    end = "<tool_call|>"

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        return parse_calls(self.inner(markup), tools)


def make_parser(tools: list | None) -> StreamingToolParser:
    return StreamingToolParser(Gemma4Dialect(), tools)
