"""Generic dialects: OpenAI-JSON in ``<tool_call>`` tags, and an adapter over
mlx-lm's own parser modules so the generic plugin covers every template mlx-lm
can infer a parser for."""

from __future__ import annotations

import importlib
from typing import Any

from .core import ToolCall, calls_from_json, make_call, normalize_call
from .stream import Dialect


class JsonDialect(Dialect):
    """Hermes/Qwen2.5 ``<tool_call>{"name":…,"arguments":{…}}</tool_call>``; also a
    bare JSON list of calls inside the tags, and repaired near-JSON."""

    starts = ("<tool_call>",)
    end = "</tool_call>"

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        return calls_from_json(self.inner(markup), tools)


class MlxLmDialect(Dialect):
    """Adapter over ``mlx_lm.tool_parsers.<name>`` (``tool_call_start``,
    ``tool_call_end``, ``parse_tool_call(text, tools)``). As in mlx-lm's server the
    parser gets the text between the markers. Imported lazily: mlx_lm pulls in MLX."""

    def __init__(self, name: str, module: Any = None):
        self.name = name
        self.module = module or importlib.import_module(f"mlx_lm.tool_parsers.{name}")
        self.starts = (self.module.tool_call_start,)
        self.end = self.module.tool_call_end or None  # "" (mistral): runs to EOS

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        try:
            out = self.module.parse_tool_call(self.inner(markup), tools)
        except Exception:
            return None
        calls = []
        for d in out if isinstance(out, list) else [out]:
            nc = normalize_call(d)
            if nc is None:
                return None
            calls.append(make_call(*nc, tools, id=d.get("id")))
        return calls or None


def infer_parser_name(chat_template: str | None, vocab: Any = None) -> str | None:
    """mlx-lm's ``_infer_tool_parser`` (tokenizer_utils.py), replicated so that
    choosing a dialect does not import MLX."""
    t = chat_template if isinstance(chat_template, str) else ""
    if t:
        if "<minimax:tool_call>" in t:
            return "minimax_m2"
        if "<|tool_call>" in t and "<tool_call|>" in t:
            return "gemma4"
        if "<start_function_call>" in t:
            return "function_gemma"
        if "<longcat_tool_call>" in t:
            return "longcat"
        if "<arg_key>" in t:
            return "glm47"
        if "<|tool_list_start|>" in t or "<|tool_call_start|>" in t:
            return "pythonic"
        if "<tool_call>\\n<function=" in t or "<tool_call>\n<function=" in t:
            return "qwen3_coder"
        if "<|tool_calls_section_begin|>" in t:
            return "kimi_k2"
        if '<function name="' in t and '<param name="' in t:
            return "minicpm5"
        if "[TOOL_CALLS]" in t:
            return "mistral"
        if "<atem:function_calls>" in t:
            return "muse_spark"
        if "<tool_call>" in t and "tool_call.name" in t:
            return "json_tools"
    v = vocab or {}
    if all(k in v for k in ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")):
        return "kimi_k3"
    if "<|tool_call_start|>" in v and "<|tool_call_end|>" in v:
        return "pythonic"
    return None


# mlx-lm parser names we implement natively in core.
NATIVE: dict[str, type[Dialect]] = {"json_tools": JsonDialect}


def dialect_for_template(chat_template: str | None, vocab: Any = None) -> Dialect | None:
    """The dialect for a chat template (and vocab), or None when mlx-lm cannot infer
    one either (callers usually fall back to :class:`JsonDialect`)."""
    name = infer_parser_name(chat_template, vocab)
    if name is None:
        return None
    if name in NATIVE:
        return NATIVE[name]()
    try:
        return MlxLmDialect(name)
    except Exception:  # parser module missing/unimportable: no dialect
        return None
