"""A small backend-neutral grammar language for markup with JSON inside (tool calls).

Formats are plain JSON-able dicts in the shape of xgrammar's structural tags (so the
xgrammar backend compiles them as they are; llguidance gets them as Lark, see
:mod:`.structural_lark`). A family's tool-call dialect builds one with these
constructors; ``GrammarRequest("structural", {"format": fmt, "describe": text})``
carries it to the registry (``describe`` is the degrade path's instruction).

Formats: ``const`` (literal text; a special token's text is that token), ``regex``,
``json`` (a JSON value following a schema; whitespace and closed objects as for
``json_schema``), ``seq``, ``alt``, ``opt``, ``star``, ``tag`` (begin,
content, end; content ``any_text()`` is free text up to the first ``end``) and
``triggered`` (free text; each trigger opens one of the tags).
"""

from __future__ import annotations

from typing import Any

Format = dict


def const(text: str) -> Format:
    return {"type": "const_string", "value": text}


def regex(pattern: str) -> Format:
    return {"type": "regex", "pattern": pattern}


def json_value(schema: Any) -> Format:
    return {"type": "json_schema", "json_schema": schema}


def any_text(max_chars: int | None = None) -> Format:
    """Free text; inside a ``tag`` it runs to the first occurrence of the tag's end."""
    out: Format = {"type": "any_text"}
    if max_chars is not None:
        out["max_chars"] = max_chars
    return out


def seq(*parts: Format) -> Format:
    parts = tuple(p for p in parts if p != const(""))
    if len(parts) == 1:
        return parts[0]
    return {"type": "sequence", "elements": list(parts)} if parts else const("")


def alt(*parts: Format) -> Format:
    if len(parts) == 1:
        return parts[0]
    return {"type": "or", "elements": list(parts)}


def opt(part: Format) -> Format:
    return {"type": "optional", "content": part}


def star(part: Format) -> Format:
    return {"type": "star", "content": part}


def tag(begin: str, content: Format, end: str) -> Format:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def triggered(tags: list[Format], *, at_least_one: bool = False,
              stop_after_first: bool = False) -> Format:
    """Free text in which each tag's ``begin`` (its trigger) starts a constrained tag."""
    return {"type": "triggered_tags", "triggers": sorted({t["begin"] for t in tags}),
            "tags": list(tags), "at_least_one": at_least_one,
            "stop_after_first": stop_after_first}


def map_json(fmt: Any, fn) -> Any:
    """A copy of ``fmt`` with every JSON node replaced by ``fn(node)``."""
    if not isinstance(fmt, dict):
        return fmt
    if fmt.get("type") == "json_schema":
        return fn(fmt)
    out = dict(fmt)
    for k in ("content", "elements", "tags"):
        v = out.get(k)
        if isinstance(v, list):
            out[k] = [map_json(x, fn) for x in v]
        elif isinstance(v, dict):
            out[k] = map_json(v, fn)
    return out
