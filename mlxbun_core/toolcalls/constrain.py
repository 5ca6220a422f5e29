"""What a request's tools, tool choice and structured-output fields constrain decoding
to, as one grammar plan.

- ``required``: the reply is one call (or several when ``parallel_tool_calls`` allows)
  in the family's own markup, arguments following the tool's schema; nothing else. So a
  forced call always parses into ``tool_calls``.
- a named function: exactly one call of it, whatever ``parallel_tool_calls`` says; the
  reply ends once that call is complete (a model pushed on would write another).
- ``auto`` with a ``strict: true`` tool: free text, but once the model opens a call
  the call is grammar-checked.
- ``auto`` with a JSON ``response_format`` (or ``structured_outputs``): the reply is
  that JSON or calls (tools stay callable under a response format). An explicit
  ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` is the whole reply.

Whenever a tool grammar is active, every call in it follows its own tool's schema
(strict or not: a call that parses beats free-form arguments).
- a dialect that cannot write a call grammar: a forced choice is asked for in words
  (degrade path: a ``Warning`` header and an instruction), never silently ignored.
"""

from __future__ import annotations

from ..grammar import GrammarPlan, GrammarRequest, describe
from ..grammar import structural as S
from ..grammar.request import Whitespace
from ..grammar_registry import registry
from .choice import ToolChoice, is_strict, tool_name

GAP = S.regex(r"[ \n]{0,2}")
"""Whitespace before, between and after forced calls (models often end a call's line
or leave a blank line after a think channel); the parser drops it."""


def plan_constraint(parser, tools: list | None, choice: ToolChoice, parallel: bool,
                    content: GrammarRequest | None, tokenizer,
                    grammars=registry) -> GrammarPlan:
    """The grammar plan for a chat request (see the module docstring)."""
    if choice.mode == "function":
        parallel = False  # one named call, then the end: grammar and parser agree
    if parser is not None and not parallel and hasattr(parser, "max_calls"):
        parser.max_calls = 1
    if parser is not None and choice.forced and hasattr(parser, "unique"):
        parser.unique = True  # a model pushed into calls may repeat one: that ends it
    req, reason = tool_request(parser, tools, choice, parallel, content)
    if reason is not None:
        return grammars.degrade(req, reason)
    return grammars.plan_request(req, tokenizer) if req is not None else GrammarPlan()


NO_GRAMMAR = "this model's tool-call dialect has no call grammar"


def tool_request(parser, tools, choice: ToolChoice, parallel: bool,
                 content: GrammarRequest | None) -> tuple[GrammarRequest | None, str | None]:
    """``(grammar request, None)``, or ``(request to describe, reason)`` when it cannot
    be enforced."""
    if not tools or choice.mode == "none":
        return content, None
    if not choice.forced and content is None and not any(is_strict(t) for t in tools):
        return None, None
    make = getattr(parser, "call_grammar", None)
    ws = content.whitespace if content is not None else "canonical"
    if choice.forced:
        chosen = [t for t in tools if choice.mode == "required" or tool_name(t) == choice.name]
        words = forced_instruction(chosen, choice)
        call = make(chosen) if make is not None else None
        if call is None:
            return _described(words), NO_GRAMMAR + "; tool_choice asked for in words"
        return _structural(calls(call, parallel), words, ws), None
    call = make(tools) if make is not None else None
    if content is not None:  # a JSON response format, or calls
        if content.kind not in ("json_schema", "json_object") or call is None:
            return content, None
        body = content.value if content.kind == "json_schema" else {"type": "object"}
        fmt = S.alt(S.json_value(body), calls(call, parallel))
        return _structural(fmt, describe(content), ws), None
    if call is None:
        return _described(""), NO_GRAMMAR + "; strict tools unchecked"
    return _structural(S.triggered([call], stop_after_first=not parallel), "", ws), None


def _structural(fmt: dict, words: str, whitespace: Whitespace) -> GrammarRequest:
    return GrammarRequest("structural", {"format": fmt, "describe": words}, whitespace)


def calls(call: dict, parallel: bool) -> dict:
    """One call, or several (``parallel``), with a little whitespace around each."""
    if not parallel:
        return S.seq(GAP, call, GAP)
    return S.seq(GAP, call, S.star(S.seq(GAP, call)), GAP)


def forced_instruction(chosen: list, choice: ToolChoice) -> str:
    if choice.mode == "function":
        return f"Respond only by calling the function {choice.name}, with no other text."
    names = ", ".join(str(tool_name(t)) for t in chosen)
    return f"Respond only by calling one of these functions: {names}; write no other text."


def _described(words: str) -> GrammarRequest:
    return _structural(S.const(""), words, "canonical")
