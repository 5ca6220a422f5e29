"""JSON Schema preparation shared by both backends.

``closed(schema)``: an object schema that lists ``properties`` and says nothing about
extra keys admits no others (``additionalProperties: false``), xgrammar's strict mode
and what OpenAI's strict structured outputs require. Without it a sampler may invent
keys and nest them until the context runs out. An explicit ``additionalProperties``
(``true`` or a schema), ``unevaluatedProperties`` or a bare ``{"type": "object"}``
(no ``properties``: "any object") is left as written. Members of ``allOf`` are not
closed (each would forbid the others' keys); their children are.
"""

from __future__ import annotations

from typing import Any

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems",
               "contains", "not", "if", "then", "else", "propertyNames")


def closed(schema: Any) -> Any:
    """A copy of ``schema`` with every open-by-omission object schema closed."""
    return _close(schema, True)


def _close(s: Any, close_here: bool) -> Any:
    if isinstance(s, list):  # "items": [...] (draft 4 tuples)
        return [_close(x, True) for x in s]
    if not isinstance(s, dict):
        return s
    out = dict(s)
    for k in _SCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: _close(sub, True) for name, sub in out[k].items()}
    for k in _SCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [_close(sub, True) for sub in out[k]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_close(sub, False) for sub in out["allOf"]]
    for k in _SCHEMA_ONE:
        if k in out:
            out[k] = _close(out[k], True)
    if (close_here and isinstance(out.get("properties"), dict)
            and "additionalProperties" not in out and "unevaluatedProperties" not in out):
        out["additionalProperties"] = False
    return out


def resolve(schema: Any, root: dict, depth: int = 0) -> Any:
    """``schema`` with a local ``$ref`` (``#/$defs/x``, ``#/definitions/x``) followed."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 32:
        ref = schema["$ref"]
        if not ref.startswith("#"):
            return schema
        node: Any = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return schema
        schema, depth = node, depth + 1
    return schema


def with_defs(schema: Any, root: dict) -> Any:
    """A sub-schema lifted out of ``root`` keeps ``root``'s definitions, so its local
    ``$ref`` pointers still resolve when it is compiled on its own."""
    if not isinstance(schema, dict):
        return schema
    defs = {k: root[k] for k in ("$defs", "definitions") if isinstance(root.get(k), dict)}
    return {**defs, **schema} if defs else schema


def json_types(schema: Any, root: dict) -> set[str]:
    """The JSON types a schema admits (empty: unknown / anything)."""
    schema = resolve(schema, root)
    if schema is True or schema == {}:
        return set()
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    out: set[str] = set()
    for k in ("anyOf", "oneOf"):
        for sub in schema.get(k) or ():
            sub_types = json_types(sub, root)
            if not sub_types:
                return set()
            out |= sub_types
    if out:
        return out
    values = schema.get("enum") if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if values is not None:
        return {_type_of(v) for v in values}
    if "properties" in schema:
        return {"object"}
    if "items" in schema:
        return {"array"}
    return set()


def _type_of(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    return {float: "number", str: "string", type(None): "null", list: "array",
            dict: "object"}.get(type(v), "string")
