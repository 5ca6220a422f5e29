"""Building blocks for a dialect's call grammar: one call of a given tool, written in
the family's own markup, with arguments that follow the tool's JSON schema.

Dialects whose arguments are one JSON object use :func:`json_envelope`; dialects that
write one markup element per argument (Qwen ``<parameter=k>``, GLM ``<arg_key>``,
MiniCPM ``<param name="k">``) use :func:`element_args` with an :class:`ArgMarkup`.
Values that are JSON strings in the schema are written raw (as the family's
templates write them and its parser reads them); every other value is JSON.

Objects in a schema that list ``properties`` and say nothing about extra keys admit
none (see :mod:`mlxbun_core.grammar.schema`); an explicit ``additionalProperties``
allows extra arguments with free names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..grammar import structural as S
from ..grammar.schema import json_types, resolve, with_defs


def tool_schemas(tools: list | None) -> list[tuple[str, dict]]:
    """``(name, parameters schema)`` for every function tool (OpenAI or flat shape)."""
    out = []
    for t in tools or ():
        f = t.get("function") if isinstance(t.get("function"), dict) else t
        name = f.get("name")
        if not isinstance(name, str) or not name:
            continue
        params = f.get("parameters", f.get("input_schema"))
        out.append((name, params if isinstance(params, dict) else {"type": "object",
                                                                      "properties": {}}))
    return out


# ---------------------------------------------------------------- JSON dialects

def envelope_schema(name: str, params: dict, args_key: str = "arguments") -> dict:
    """``{"name": <name>, "arguments": {...}}`` as one JSON schema."""
    return {"type": "object", "properties": {"name": {"const": name}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


def json_envelope(tools: list, begin: str, end: str, *, pad: str = r"\n?",
                  args_key: str = "arguments") -> dict:
    """``begin {"name": …, "arguments": {…}} end`` for any of ``tools``; ``pad`` (a
    regex: an optional newline) may frame the JSON, as Hermes-style templates write it."""
    schemas = [envelope_schema(n, p, args_key) for n, p in tool_schemas(tools)]
    body = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return S.tag(begin, S.seq(S.regex(pad), S.json_value(body), S.regex(pad)), end)


# ---------------------------------------------------------------- element dialects

def string_only(schema, root: dict) -> bool:
    """Whether a value is a JSON string for sure (so it is written raw)."""
    return json_types(schema, root) == {"string"}


def raw_string(schema, root: dict, close: str, pad: str = "",
               text: Callable[[int | None], dict] | None = None) -> dict:
    """A raw (unquoted) string value, then ``close``: an enum / const is one of its
    values and a ``pattern`` its regex (then ``pad`` and ``close``); otherwise free
    text (``maxLength`` bounds it) running to the first ``close``, as the parsers
    read it. ``text(max_chars)`` overrides the free-text form (``close`` included)."""
    s = resolve(schema, root)
    s = s if isinstance(s, dict) else {}
    values = s.get("enum") if isinstance(s.get("enum"), list) else (
        [s["const"]] if "const" in s else None)
    if values is not None:
        return S.seq(S.alt(*[S.const(str(v)) for v in values]), S.const(pad + close))
    if isinstance(s.get("pattern"), str):
        return S.seq(S.regex(_anchorless(s["pattern"])), S.const(pad + close))
    limit = s.get("maxLength") if isinstance(s.get("maxLength"), int) else None
    if text is not None:
        return text(limit)
    return free_text(close, limit)


def free_text(close: str, limit: int | None = None) -> dict:
    """Text up to the first ``close``, then ``close``. With a ``limit`` the text may not
    hold ``close``'s first character (a bounded run that provably stops before
    ``close``, in whole characters on both backends)."""
    if limit is None:
        return S.tag("", S.any_text(), close)
    first = re.escape(close[0]) if close else ""
    body = r"(?s:.{0,%d})" % limit if not first else r"[^%s]{0,%d}" % (first, limit)
    return S.seq(S.regex(body), S.const(close))


def _anchorless(pattern: str) -> str:
    """JSON Schema patterns are searched; the grammar matches whole values, so a
    pattern's own ``^``/``$`` anchors are dropped."""
    p = pattern
    if p.startswith("^"):
        p = p[1:]
    if p.endswith("$") and not p.endswith("\\$"):
        p = p[:-1]
    return p


@dataclass
class ArgMarkup:
    """One argument is ``key_open NAME key_close VALUE value_close after``; a free-text
    value runs to the first ``value_close`` (what the parser looks for), other values
    are followed by ``pad value_close`` (Qwen frames values with newlines)."""

    key_open: str
    key_close: str
    value_close: str
    pad: str = ""
    after: str = ""
    name_regex: str = r"[A-Za-z0-9_.\-]+"
    string: Callable[[dict, dict], dict] | None = None  # (schema, root) -> value + close

    def arg(self, name: str, schema, root: dict) -> dict:
        head = S.const(self.key_open + name + self.key_close)
        return S.seq(head, self.value(schema, root), S.const(self.after))

    def value(self, schema, root: dict) -> dict:
        if string_only(schema, root):
            if self.string is not None:
                return self.string(schema, root)
            return raw_string(schema, root, self.value_close, self.pad)
        types = json_types(schema, root)
        if not types or "string" in types:  # anything, or a string among others: raw text
            return S.tag("", S.any_text(), self.value_close)
        return S.seq(S.json_value(with_defs(schema, root)), S.const(self.pad + self.value_close))

    def extra(self, schema, root: dict) -> dict:
        """An argument not declared in the schema (``additionalProperties``)."""
        head = S.seq(S.const(self.key_open), S.regex(self.name_regex), S.const(self.key_close))
        value = (S.tag("", S.any_text(), self.value_close) if schema is True
                 else self.value(schema, root))
        return S.seq(head, value, S.const(self.after))


def element_args(params: dict, markup: ArgMarkup) -> dict:
    """Every declared argument in schema order (optional ones may be left out), then
    extra arguments where the schema allows them."""
    root = params if isinstance(params, dict) else {}
    props = root.get("properties")
    if not isinstance(props, dict):
        props = {}
    required = set(root.get("required") or ()) if isinstance(root.get("required"), list) else set()
    parts = []
    for name, sub in props.items():
        one = markup.arg(name, sub, root)
        parts.append(one if name in required else S.opt(one))
    extra = root.get("additionalProperties", not (props or "properties" in root))
    if extra is True or isinstance(extra, dict):
        parts.append(S.star(markup.extra(extra, root)))
    return S.seq(*parts)
