"""Generic dialects: OpenAI-JSON in ``<tool_call>`` tags, and an adapter over
mlx-lm's own parser modules so the generic plugin covers every parser mlx-lm
infers for a checkpoint."""

from __future__ import annotations

import importlib
import json
from typing import Any

from .core import ToolCall, calls_from_json, make_call, normalize_call
from .grammar import json_envelope
from .json_scan import JsonScanner
from .stream import Dialect


class JsonDialect(Dialect):
    """Hermes/Qwen2.5 ``<tool_call>{"name":…,"arguments":{…}}</tool_call>``; also a
    bare JSON list of calls inside the tags, and repaired near-JSON."""

    starts = ("<tool_call>",)
    end = "</tool_call>"

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        return calls_from_json(self.inner(markup), tools)

    def scanner(self) -> JsonScanner:
        return JsonScanner(self.starts[0])

    def whole_at_eos(self, markup: str) -> bool:
        """The body is one complete JSON value (only ``</tool_call>`` is missing)."""
        try:
            json.loads(self.inner(markup))
        except ValueError:
            return False
        return True

    def call_grammar(self, tools: list) -> dict | None:
        """``<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`` (Hermes)."""
        return json_envelope(tools, self.starts[0], self.end)


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


# mlx-lm parser names we implement natively in core.
NATIVE: dict[str, type[Dialect]] = {"json_tools": JsonDialect}


def dialect_for_parser(name: str | None) -> Dialect | None:
    """Our dialect for an mlx-lm parser name (``json_tools``, ``qwen3_coder``, …)."""
    if name is None:
        return None
    if name in NATIVE:
        return NATIVE[name]()
    try:
        return MlxLmDialect(name)
    except Exception:  # parser module missing/unimportable: no dialect
        return None


def dialect_for_tokenizer(tokenizer) -> Dialect | None:
    """The dialect mlx-lm chose when it loaded ``tokenizer`` (``tool_parser_type`` in
    tokenizer_config.json, else its inference from the chat template and vocab), or
    None when it found none (callers usually fall back to :class:`JsonDialect`)."""
    parse = getattr(tokenizer, "tool_parser", None)
    module = getattr(parse, "__module__", "") or ""
    if not module.startswith("mlx_lm.tool_parsers."):
        return None
    return dialect_for_parser(module.rsplit(".", 1)[-1])
