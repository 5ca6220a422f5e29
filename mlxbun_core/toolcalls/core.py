"""Family-agnostic tool-call helpers: JSON repair, envelope normalization and
schema-driven argument coercion. The :class:`ToolCall` record itself lives in
:mod:`mlxbun_core.events` (re-exported here and from :mod:`mlxbun_core.toolcalls`).

Every dialect funnels through ``make_call`` so argument typing is identical on all
surfaces (string-typed params stay strings, other types are JSON-decoded)."""

from __future__ import annotations

import json
import re
from typing import Any

from ..events import ToolCall, new_call_id

__all__ = [
    "ToolCall", "new_call_id", "find_tool", "tool_params", "coerce_arguments",
    "repair_json", "normalize_call", "make_call", "calls_from_json", "arg_types", "coerce_value",
]


# --------------------------------------------------------------------------- tools

def find_tool(tools: list | None, name: str) -> dict | None:
    """The function-level dict (``name``, ``parameters``...) of tool ``name``.

    Accepts OpenAI ``{"type":"function","function":{…}}`` and flat ``{"name":…}``
    (Anthropic/Responses) shapes."""
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        f = t.get("function")
        if not isinstance(f, dict):
            f = t
        if f.get("name") == name:
            return f
    return None


def tool_params(tools: list | None, name: str) -> dict | None:
    """The JSON schema of tool ``name``'s parameters, or None."""
    f = find_tool(tools, name)
    if f is None:
        return None
    p = f.get("parameters", f.get("input_schema"))
    return p if isinstance(p, dict) else None


# ------------------------------------------------------------------- coercion

def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    out: set[str] = set()
    t = schema.get("type")
    if isinstance(t, str):
        out.add(t)
    elif isinstance(t, list):
        out.update(x for x in t if isinstance(x, str))
    for k in ("anyOf", "oneOf", "allOf"):
        for s in schema.get(k) or ():
            out |= _types(s)
    if not out and isinstance(schema.get("enum"), list):
        for v in schema["enum"]:
            out.add({bool: "boolean", int: "integer", float: "number", str: "string",
                     type(None): "null", list: "array", dict: "object"}.get(type(v), "string"))
    if not out and "properties" in schema:
        out.add("object")
    if not out and "items" in schema:
        out.add("array")
    return {x.lower() for x in out}


def _fits(x: Any, types: set[str]) -> bool:
    if x is None:
        return "null" in types or bool(types & {"integer", "number", "boolean", "array", "object"})
    if isinstance(x, bool):
        return "boolean" in types
    if isinstance(x, (int, float)):
        return bool(types & {"integer", "number"})
    if isinstance(x, list):
        return "array" in types
    if isinstance(x, dict):
        return "object" in types
    return False


_PY = {"True": True, "False": False, "None": None}


def _coerce_one(v: Any, types: set[str]) -> Any:
    if not isinstance(v, str):
        # A JSON dialect gave a non-string for a string-only param: keep its text.
        if v is not None and types and types <= {"string", "null"}:
            return json.dumps(v, ensure_ascii=False)
        return v
    if "string" in types:
        return v  # verbatim: "007" stays "007"
    s = v.strip()
    try:
        x = json.loads(s, strict=False)
    except ValueError:
        if s in _PY:
            x = _PY[s]
        elif types & {"array", "object"} or not types:
            x = repair_json(s) if s[:1] in "{[" else v
        else:
            return v
    if not types:  # unknown param: only lift structured values
        return x if isinstance(x, (dict, list)) else v
    if isinstance(x, float) and "integer" in types and "number" not in types and x.is_integer():
        x = int(x)
    return x if _fits(x, types) else v


def coerce_arguments(args: dict, tool_schema_params: dict | None) -> dict:
    """Decode argument values against the tool's parameter schema.

    ``tool_schema_params`` is the tool's ``parameters`` object (or directly its
    ``properties`` map). String-typed params stay strings verbatim; number/integer/
    boolean/array/object params given as text are JSON-decoded, falling back to the
    raw string when they do not decode to that type."""
    if not isinstance(args, dict):
        return args
    props = _properties(tool_schema_params)
    return {k: _coerce_one(v, _types(props.get(k))) for k, v in args.items()}


def _properties(params: dict | None) -> dict:
    p = params or {}
    props = p.get("properties")
    if not isinstance(props, dict):
        props = p if "type" not in p else {}
    return props


def arg_types(tool_schema_params: dict | None, key: str) -> set[str]:
    """The JSON types argument ``key`` may take (empty: the schema does not say)."""
    return _types(_properties(tool_schema_params).get(key))


def coerce_value(value, types: set[str]):
    """One argument value decoded as :func:`coerce_arguments` decodes it."""
    return _coerce_one(value, types)


# --------------------------------------------------------------------- repair

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\n?(.*?)(?:```|$)", re.S)
_IDENT = re.compile(r"(?:[^\W\d]|\$)[\w$-]*")  # any letter starts a bare key (str.isalpha)
_LITERALS = {"True": "true", "False": "false", "None": "null",
             "true": "true", "false": "false", "null": "null"}


def _loads(s: str) -> Any:
    return json.loads(s, strict=False)


_COLON = re.compile(r"\s*:")


def _scan(s: str) -> tuple[str, list[str], list[tuple[int, list[str]]]]:
    """One pass over JSON-ish text: single→double quotes, Python literals outside
    strings, bare keys quoted, trailing commas dropped. Returns the rewritten text,
    the still-open closers and cut points (offset, open closers) for truncation."""
    out: list[str] = []
    size = 0
    stack: list[str] = []
    cuts: list[tuple[int, list[str]]] = []
    q = None  # open string quote
    esc = False
    i, n = 0, len(s)

    def emit(x: str) -> None:
        nonlocal size
        out.append(x)
        size += len(x)

    while i < n:
        c = s[i]
        if q:
            text, q, esc = _string_char(c, q, esc)
            if text:
                emit(text)
            i += 1
            continue
        if c in "\"'":
            q = c
            emit('"')
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
            emit(c)
            cuts.append((size, list(stack)))
        elif c in "}]":
            size -= _drop_trailing_comma(out)
            if not stack:
                break
            emit(stack.pop())
            if not stack:
                return "".join(out), [], cuts
        elif c == ",":
            cuts.append((size, list(stack)))
            emit(c)
        elif c.isalpha() or c in "_$":
            m = _IDENT.match(s, i)
            assert m is not None  # a letter, _ or $ starts an identifier
            emit(_bare_word(s, m, in_object=stack[-1:] == ["}"]))
            i = m.end()
            continue
        else:
            emit(c)
        i += 1
    if q:
        emit('"')
    return "".join(out), stack, cuts


def _string_char(c: str, q: str, esc: bool) -> tuple[str, str | None, bool]:
    """One character inside a string opened by quote ``q`` (``esc``: after a backslash):
    ``(text to emit, the open quote or None once closed, esc)``. The string comes out
    double-quoted: its closing quote becomes ``"``, a bare ``"`` in it is escaped, and an
    escaped ``'`` needs no backslash."""
    if esc:
        return ("'" if c == "'" else "\\" + c), q, False
    if c == "\\":
        return "", q, True
    if c == q:
        return '"', None, False
    if c == '"':
        return '\\"', q, False  # inside a single-quoted string
    return c, q, False


def _drop_trailing_comma(out: list[str]) -> int:
    """Before a closer: drop the ``,`` that ends ``out`` (and the blanks after it, which
    go with it); the number of characters dropped (0: no trailing comma)."""
    ws = []
    while out and not out[-1].strip():
        ws.append(out.pop())
    if out and out[-1] == ",":
        out.pop()
        return 1 + sum(map(len, ws))
    out.extend(reversed(ws))
    return 0


def _bare_word(s: str, m: re.Match[str], *, in_object: bool) -> str:
    """The identifier ``m`` as JSON: a Python/JSON literal as JSON's, a key (a word before
    ``:``) in an object quoted, anything else as it is."""
    w = m.group(0)
    keyish = _COLON.match(s, m.end()) is not None
    if w in _LITERALS and not keyish:
        return _LITERALS[w]
    if in_object and keyish:
        return json.dumps(w)  # bare key
    return w


def _close(body: str, stack: list[str]) -> str:
    body = body.rstrip()
    if body.endswith(","):
        body = body[:-1]
    if body.endswith(":"):
        body += " null"
    return body + "".join(reversed(stack))


def repair_json(text: str) -> Any | None:
    """Best-effort JSON decode of model output; None when nothing sensible is left.

    Strips a ```json fence or prose prefix before the first ``{``/``[``, fixes single
    quotes, bare keys and trailing commas, maps Python ``True/False/None`` outside
    strings, closes truncated strings/braces (dropping a dangling partial member)
    and ignores trailing prose after the value."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    try:
        return _loads(s)
    except ValueError:
        pass
    def first(t: str) -> int:
        return min((i for i in (t.find("{"), t.find("[")) if i >= 0), default=-1)

    f = s.find("```")
    if 0 <= f < first(s) or (f == 0):  # a fence before the value, not one inside it
        m = _FENCE.search(s)
        s = m.group(1).strip() if m else s
    b = first(s)
    if b < 0:
        return None
    s = s[b:]
    try:
        return json.JSONDecoder(strict=False).raw_decode(s)[0]
    except ValueError:
        pass
    body, stack, cuts = _scan(s)
    for cand in [_close(body, stack)] + [_close(body[:o], st) for o, st in reversed(cuts)]:
        try:
            return _loads(cand)
        except ValueError:
            continue
    return None


# ------------------------------------------------------------------- envelope

_ARG_KEYS = ("arguments", "parameters", "args", "input")


def _decode_args(a: Any) -> Any:
    if isinstance(a, str):
        return repair_json(a) if a.strip() else {}
    return {} if a is None else a


def normalize_call(obj: Any) -> tuple[str, dict] | None:
    """``(name, args)`` from a decoded call envelope, or None.

    Accepts ``{"name", "arguments"|"parameters"}`` (also the OpenAI
    ``{"function": {…}}`` wrapper), arguments as an object or JSON string, and lifts
    a name that landed inside ``arguments`` into the envelope."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    name = obj.get("name")
    if name is None and isinstance(obj.get("function"), str):
        name = obj["function"]
    args = next((obj[k] for k in _ARG_KEYS if k in obj), None)
    if isinstance(name, dict):
        args = args if args is not None else next((name[k] for k in _ARG_KEYS if k in name), None)
        name = name.get("name")
    args = _decode_args(args)
    if isinstance(args, dict) and isinstance(args.get("name"), str):
        inner_keys = [k for k in _ARG_KEYS if k in args]
        if not name:  # name landed inside arguments
            args = dict(args)
            name = args.pop("name")
            if inner_keys and len(args) == 1:
                args = _decode_args(args[inner_keys[0]])
        elif args["name"] == name and inner_keys and len(args) == 2:
            args = _decode_args(args[inner_keys[0]])  # envelope duplicated inside
    if not isinstance(name, str) or not name.strip() or not isinstance(args, dict):
        return None
    return name.strip(), args


def make_call(name: str, args: dict, tools: list | None, id: str | None = None) -> ToolCall:
    """Coerce ``args`` against tool ``name``'s schema and wrap them."""
    args = coerce_arguments(args, tool_params(tools, name))
    tc = ToolCall(name, json.dumps(args, ensure_ascii=False))
    if isinstance(id, str) and id:
        tc.id = id
    return tc


def _json_values(text: str) -> list[Any] | None:
    """Decode one JSON value, several back to back, or (repaired) one value."""
    s = text.strip()
    if not s:
        return None
    try:
        return [_loads(s)]
    except ValueError:
        pass
    dec, vals, i = json.JSONDecoder(strict=False), [], 0
    try:
        while i < len(s):
            v, i = dec.raw_decode(s, i)
            vals.append(v)
            while i < len(s) and s[i] in " \t\r\n,;":
                i += 1
        return vals
    except ValueError:
        pass
    v = repair_json(s)
    return None if v is None else [v]


def calls_from_json(text: str, tools: list | None) -> list[ToolCall] | None:
    """Calls from JSON text: an envelope, a list of them, ``{"tool_calls": […]}``,
    or several envelopes back to back. None if any item is not a call."""
    vals = _json_values(text)
    if vals is None:
        return None
    items: list[Any] = []
    for v in vals:
        if isinstance(v, dict) and isinstance(v.get("tool_calls"), list):
            v = v["tool_calls"]
        items.extend(v if isinstance(v, list) else [v])
    calls = []
    for it in items:
        nc = normalize_call(it)
        if nc is None:
            return None
        calls.append(make_call(*nc, tools, id=it.get("id")))
    return calls or None
