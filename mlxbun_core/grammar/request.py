"""What a request asks to be constrained to: parsing, validation and precedence of
the OpenAI / vLLM / oMLX structured-output fields (see docs: "Structured output").

Kept backend-free so the server can validate a body (and answer 400) before any
grammar library is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import BadRequest

Kind = Literal["json_schema", "json_object", "ebnf", "regex", "choice", "structural"]
KINDS = ("json_schema", "json_object", "ebnf", "regex", "choice", "structural")

Whitespace = Literal["canonical", "compact", "any"]
WHITESPACE = ("canonical", "compact", "any")
SEPARATORS = {"canonical": (", ", ": "), "compact": (",", ":")}
"""The item and key separators of the exact layouts, the only whitespace they allow.
"canonical" is what Jinja's ``tojson`` writes in chat templates (and Python's
``json.dumps``): one line, a space after each comma and colon, the model's own layout."""


@dataclass(frozen=True)
class GrammarRequest:
    """One constraint. ``value``: schema dict (json_schema), None (json_object),
    grammar text (ebnf), pattern (regex), list of strings (choice) or a
    :mod:`structural <.structural>` format (structural: tool-call markup).

    ``whitespace`` applies to every JSON part: "canonical" (the default) is one line
    with ``", "`` and ``": "`` separators and no other whitespace, "compact" the same
    without the spaces (``any_whitespace: false``), "any" free whitespace (opt-in:
    ``any_whitespace: true``). See :data:`SEPARATORS`."""

    kind: Kind
    value: Any = None
    whitespace: Whitespace = "canonical"
    key: str = field(init=False, repr=False, compare=True, hash=True)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}")
        if self.whitespace not in WHITESPACE:
            raise ValueError(f"unknown whitespace mode {self.whitespace!r}")
        # Canonical text so equal schemas share one compile-cache entry.
        canon = json.dumps([self.kind, self.value, self.whitespace],
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        object.__setattr__(self, "key", canon)

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, GrammarRequest) and self.key == other.key


def _bad(msg: str, param: str) -> BadRequest:
    return BadRequest(msg, param=param)


def _nonempty_str(body: dict, name: str) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise _bad(f"{name} must be a non-empty string", name)
    return v


def _response_format(body: dict) -> GrammarRequest | None:
    return response_format_request(body.get("response_format"))


def response_format_request(rf, name: str = "response_format") -> GrammarRequest | None:
    """An OpenAI ``response_format`` object sent as ``name``, or None (absent, or text)."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise _bad(f"{name} must be an object", name)
    typ = rf.get("type")
    if typ == "text":
        return None
    if typ == "json_object":
        return GrammarRequest("json_object", None, _whitespace(rf, name))
    if typ != "json_schema":
        raise _bad(f"{name}.type must be one of 'text', 'json_object', 'json_schema'",
                   f"{name}.type")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise _bad(f"{name}.json_schema must be an object when type is 'json_schema'",
                   f"{name}.json_schema")
    schema = json_schema(js.get("schema"), f"{name}.json_schema")
    return GrammarRequest("json_schema", schema, _whitespace(js, f"{name}.json_schema"))


def json_schema(schema, where: str) -> dict:
    """The ``schema`` of the JSON-schema format at ``where`` (``text.format`` on Responses,
    ``output_config.format`` on Anthropic); a 400 naming ``where.schema`` when it is not
    an object."""
    if not isinstance(schema, dict):
        raise _bad(f"{where}.schema must be a JSON schema object", f"{where}.schema")
    return schema


def _whitespace(obj: dict, where: str) -> Whitespace:
    """``any_whitespace``: absent = canonical, true = any, false = compact."""
    ws = obj.get("any_whitespace")
    if ws is None:
        return "canonical"
    if not isinstance(ws, bool):
        raise _bad(f"{where}.any_whitespace must be a boolean", f"{where}.any_whitespace")
    return "any" if ws else "compact"


def resolve_grammar_request(body: dict) -> GrammarRequest | None:
    """The constraint a request body asks for, or None.

    Every present field is validated (a mistyped lower-precedence field is still a
    client error); then precedence picks one: guided_grammar > response_format
    json_schema > json_object > structured_outputs > guided_regex > guided_choice.
    """
    grammar = _nonempty_str(body, "guided_grammar")
    rf = _response_format(body)
    so = body.get("structured_outputs")
    if so is not None and not isinstance(so, dict):
        raise _bad("structured_outputs must be a JSON schema object", "structured_outputs")
    regex = _nonempty_str(body, "guided_regex")
    choice = body.get("guided_choice")
    if choice is not None and (not isinstance(choice, list) or not choice
                               or not all(isinstance(c, str) for c in choice)):
        raise _bad("guided_choice must be a non-empty list of strings", "guided_choice")

    if grammar is not None:
        return GrammarRequest("ebnf", grammar)
    if rf is not None:
        return rf
    if so is not None:
        return GrammarRequest("json_schema", so)
    if regex is not None:
        return GrammarRequest("regex", regex)
    if choice is not None:
        return GrammarRequest("choice", list(choice))
    return None


BUDGET_CLOSE = "budget_close"
"""mlxbun's request field (default true): a constrained reply closes within max_tokens."""


def budget_close(body: dict) -> bool:
    """The request's ``budget_close`` switch (absent: on); 400 when it is not a boolean."""
    value = body.get(BUDGET_CLOSE)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise _bad(f"{BUDGET_CLOSE} must be a boolean", BUDGET_CLOSE)
    return value


def describe(req: GrammarRequest) -> str:
    """Plain-language instruction for the degrade path (injected as a system message)."""
    if req.kind == "json_schema":
        schema = json.dumps(req.value, ensure_ascii=False)
        return f"Respond only with JSON matching this schema: {schema}"
    if req.kind == "json_object":
        return "Respond only with a single valid JSON object and nothing else."
    if req.kind == "ebnf":
        return f"Respond only with text matching this grammar:\n{req.value}"
    if req.kind == "regex":
        return f"Respond only with text matching this regular expression: {req.value}"
    if req.kind == "structural":  # "" (free text with checked tool calls): nothing to ask
        return req.value.get("describe", "")
    opts = ", ".join(json.dumps(c, ensure_ascii=False) for c in req.value)
    return f"Respond with exactly one of the following, and nothing else: {opts}"
