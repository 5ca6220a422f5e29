"""Streaming tool-call parsing shared by every surface and family plugin.

A family plugin subclasses :class:`Dialect` (``starts``, ``end``, ``parse``) and
returns ``StreamingToolParser(MyDialect(), tools)`` from its ``tool_call_parser``
hook; ``parse`` builds calls with :func:`make_call` so argument coercion is uniform.
"""

from .choice import ToolChoice, check_tools, is_strict, parse_parallel, parse_tool_choice, tool_name
from .constrain import plan_constraint
from .core import (
                   ToolCall,
                   calls_from_json,
                   coerce_arguments,
                   find_tool,
                   make_call,
                   new_call_id,
                   normalize_call,
                   repair_json,
                   tool_params,
)
from .dialects import JsonDialect, MlxLmDialect, dialect_for_parser, dialect_for_tokenizer
from .stream import KEEPALIVE_EVERY, Dialect, Event, StreamingToolParser, split_tool_calls

__all__ = [
    "ToolChoice", "check_tools", "is_strict", "parse_parallel", "parse_tool_choice",
    "tool_name", "plan_constraint",
    "ToolCall", "Dialect", "Event", "StreamingToolParser", "split_tool_calls",
    "KEEPALIVE_EVERY", "JsonDialect", "MlxLmDialect", "dialect_for_parser",
    "dialect_for_tokenizer", "coerce_arguments", "find_tool", "tool_params", "repair_json",
    "normalize_call", "make_call", "calls_from_json", "new_call_id",
]
