"""Anthropic tools, ``tool_choice`` and tool search, as the engine takes them.

Client tools (no ``type``, or ``custom``) become chat function tools; server tools
(web_search, bash, text_editor, …) are skipped. Tool search: a tool with
``defer_loading: true`` is not shown to the model until a ``tool_reference`` block
in a tool_result names it; that block then renders, where it stands, as the tool's
definition (``<function>{"description", "name", "parameters"}</function>``, the form
Claude Code's own ToolSearch uses). Loading a tool thus never rewrites the tool list
at the top of the prompt, and the prefix cache keeps serving everything before it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...errors import BadRequest
from ...toolcalls.choice import ToolChoice


@dataclass
class ToolSet:
    chat_tools: list[dict[str, Any]] | None = None  # the tools shown up front (chat shape)
    # name -> function dict, deferred included
    definitions: dict[str, dict[str, Any]] = field(default_factory=dict)


def _function(t: dict[str, Any], i: int) -> dict[str, Any]:
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"tools[{i}].name must be a non-empty string")
    description = t.get("description")
    if description is not None and not isinstance(description, str):
        raise BadRequest(f"tools[{i}].description must be a string")
    if not isinstance(t.get("input_schema"), dict):
        raise BadRequest(f"tools[{i}].input_schema must be an object")
    fn = {"name": name, "description": description or "", "parameters": t["input_schema"]}
    if t.get("strict") is not None:
        if not isinstance(t["strict"], bool):
            raise BadRequest(f"tools[{i}].strict must be a boolean")
        fn["strict"] = t["strict"]
    return fn


def tool_set(tools: object) -> ToolSet:
    """The request's ``tools``: those shown up front, and every client tool by name."""
    if tools is None:
        return ToolSet()
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    shown: list[dict[str, Any]] = []
    definitions: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}] must be an object")
        if t.get("type") not in (None, "custom"):
            continue  # web_search, bash, text_editor, …: not ours
        fn = _function(t, i)
        deferred = t.get("defer_loading", False)
        if not isinstance(deferred, bool):
            raise BadRequest(f"tools[{i}].defer_loading must be a boolean")
        definitions[fn["name"]] = fn
        if not deferred:
            shown.append({"type": "function", "function": fn})
    return ToolSet(shown or None, definitions)


def reference_text(block: dict[str, Any], tools: ToolSet) -> str:
    """A ``tool_reference`` block as the definition of the tool it loads."""
    name = block.get("tool_name")
    if not isinstance(name, str) or not name:
        raise BadRequest("tool_reference tool_name must be a non-empty string")
    fn = tools.definitions.get(name)
    shown = {"description": fn["description"], "name": name, "parameters": fn["parameters"]} \
        if fn else {"name": name}
    return "<function>" + json.dumps(shown, ensure_ascii=False) + "</function>\n"


def tool_choice(choice: object,
                tools: list[dict[str, Any]] | None) -> tuple[ToolChoice, bool | None]:
    """Anthropic's tool_choice as the engine's ``(ToolChoice, parallel_tool_calls)``
    (``parallel`` None: not said). Without tools shown up front the choice is auto."""
    if choice is None:
        return ToolChoice("auto"), None
    if not isinstance(choice, dict):
        raise BadRequest('tool_choice must be an object, e.g. {"type": "auto"}')
    kind = choice.get("type")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("tool_choice.disable_parallel_tool_use must be a boolean")
    parallel = None if parallel is None else not parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("tool_choice.name must be a non-empty string")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise BadRequest(f"tool_choice.name: no tool named {name!r} in tools")
        return ToolChoice("function", name), parallel
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind) \
        if isinstance(kind, str) else None
    if mapped is None:
        raise BadRequest("tool_choice.type must be one of auto, any, tool, none")
    if mapped == "required" and not tools:
        raise BadRequest('tool_choice {"type": "any"} needs tools')
    if not tools:  # nothing to choose among (and no call to force)
        return ToolChoice("auto"), None
    return ToolChoice(mapped), parallel
