"""``tool_choice`` and ``parallel_tool_calls`` of an OpenAI chat body, checked against
the request's tools, as the engine's :class:`ToolChoice`. The Anthropic and Responses
surfaces read their own forms into a :class:`ToolChoice` directly."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadRequest

MODES = ("none", "auto", "required", "function")


@dataclass(frozen=True)
class ToolChoice:
    """``mode``: none (tools off), auto (the model decides), required (at least one
    call) or function (a call of ``name``)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")


def tool_name(tool) -> str | None:
    f = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = f.get("name") if isinstance(f, dict) else None
    return name if isinstance(name, str) and name else None


def is_strict(tool) -> bool:
    f = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return f.get("strict") is True


def check_tools(tools) -> list | None:
    """The request's function tools (None when absent or empty); 400 when ill-formed."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequest("tools must be a list of objects", param="tools")
    for i, t in enumerate(tools):
        if tool_name(t) is None:
            raise BadRequest(f"tools[{i}].function.name must be a non-empty string",
                             param="tools")
        f = t.get("function") if isinstance(t.get("function"), dict) else t
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON schema object",
                             param="tools")
    return tools


def parse_tool_choice(value, tools: list | None) -> ToolChoice:
    """The request's tool choice; 400 for an unknown form, a forced choice without
    tools, or a function that is not among the tools."""
    if value is None:
        return ToolChoice("auto")
    if value in ("none", "auto", "required"):
        choice = ToolChoice(value)
    elif isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest("tool_choice.function.name must be a non-empty string",
                             param="tool_choice")
        choice = ToolChoice("function", name)
    else:
        raise BadRequest('tool_choice must be "none", "auto", "required" or '
                         '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    if choice.forced and not tools:
        raise BadRequest(f"tool_choice {value!r} needs tools", param="tool_choice")
    if choice.name is not None and choice.name not in {tool_name(t) for t in tools or ()}:
        raise BadRequest(f"tool_choice names function {choice.name!r}, which is not among "
                         "the tools", param="tool_choice")
    return choice


def parse_parallel(value) -> bool:
    """``parallel_tool_calls`` (default true): false allows one call per reply."""
    if value is None:
        return True
    if not isinstance(value, bool):
        raise BadRequest("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    return value
