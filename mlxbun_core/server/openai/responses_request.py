"""The OpenAI Responses request, parsed straight into the engine's typed chat request.

Input items become the chat-shaped history every template reads (:func:`conversation`,
which the ``--isolate`` parent also uses to keep the history); the other fields go
through the shared validators (:mod:`mlxbun_core.engine.request`,
:mod:`mlxbun_core.engine.sampling`) under their Responses names (``max_output_tokens``,
``text.format``, ``reasoning.effort``, ``input``), so an error names the field the
client sent.
"""

from __future__ import annotations

from typing import Any

from ...chat_template import check_reasoning_effort
from ...engine.request import (
    ChatRequest,
    GenerateOptions,
    boolean_field,
    chat_request,
    string_field,
    template_kwargs_field,
)
from ...engine.sampling import SamplingParams, max_tokens_field, stop_sequences
from ...engine.speculate import speculation_field
from ...errors import BadRequest
from ...grammar.request import GrammarRequest, budget_close, json_schema, response_format_request
from ...toolcalls.choice import ToolChoice, check_tools, parse_parallel

# the sampler fields are request_fields' rows for "responses"; ``stop``,
# ``chat_template_kwargs``, ``reasoning_effort``, ``response_format``, ``adapter``,
# ``parallel_tool_calls`` and ``budget_close`` are read as in a chat body too
TEXT_PARTS = ("input_text", "output_text", "text")


def _string(value: object, where: str, param: str = "input") -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string", param=param)
    return value


def _part(part: Any) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PARTS:
        return {"type": "text", "text": _string(part.get("text"), f"{kind} text")}
    if kind == "refusal":
        return {"type": "text", "text": _string(part.get("refusal"), "refusal text")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise BadRequest("input_image needs an image_url (file_id is not supported)",
                             param="input")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio") or {}}
    raise BadRequest(f"unsupported content part type: {kind!r}", param="input")


def _content(content: object) -> str | list[dict[str, Any]]:
    """Message content as a string, or OpenAI chat parts when media is present."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or a list of parts", param="input")
    parts = [_part(p) for p in content]
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _text(content: object) -> str:
    c = _content(content)
    if not isinstance(c, str):
        raise BadRequest("system/developer content must be text", param="input")
    return c


def translate_input(value: object) -> tuple[list[str], list[dict[str, Any]]]:
    """``input`` → (system texts, chat messages without the system message)."""
    if isinstance(value, str):
        return [], [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise BadRequest("input must be a string or a list of items", param="input")
    system: list[str] = []
    msgs: list[dict[str, Any]] = []
    for item in value:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object", param="input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role in ("system", "developer"):
                system.append(_text(item.get("content")))
            elif role in ("user", "assistant"):
                msgs.append({"role": role, "content": _content(item.get("content"))})
            else:
                raise BadRequest(f"unsupported message role: {role!r}", param="input")
        elif kind == "function_call":
            name = _string(item.get("name"), "function_call name")
            args = item.get("arguments")
            call: dict[str, Any] = {
                "id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                "function": {"name": name, "arguments": "{}" if args is None else
                             _string(args, "function_call arguments")}}
            last = msgs[-1] if msgs else None
            if (last is not None and last["role"] == "assistant"
                    and isinstance(last["content"], str)):
                last.setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            msgs.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                         "content": out if isinstance(out, str) else _content(out or "")})
        elif kind in ("reasoning", "item_reference"):
            continue  # reasoning is not replayed; references have nothing to resolve against
        else:
            raise BadRequest(f"unsupported input item type: {kind!r}", param="input")
    return system, msgs


def _tools(tools: object) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out: list[dict[str, Any]] = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}] must be an object", param="tools")
        if t.get("type") != "function":
            continue  # built-in tools (web_search, file_search, mcp, …) are not ours
        if isinstance(t.get("function"), dict):
            out.append(t)  # already chat-shaped
            continue
        name, params = t.get("name"), t.get("parameters")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"tools[{i}].name must be a non-empty string", param="tools")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"tools[{i}].parameters must be a JSON schema object",
                             param="tools")
        description = t.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(f"tools[{i}].description must be a string", param="tools")
        strict = True if t.get("strict") is None else t["strict"]  # the Responses default
        if not isinstance(strict, bool):
            raise BadRequest(f"tools[{i}].strict must be a boolean", param="tools")
        out.append({"type": "function", "function": {
            "name": name, "description": description or "", "strict": strict,
            "parameters": params or {"type": "object", "properties": {}}}})
    return out or None


def _tool_choice(choice: object, tools: list[dict[str, Any]] | None) -> ToolChoice:
    if choice is None or choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise BadRequest('tool_choice "required" needs function tools', param="tool_choice")
        return ToolChoice(choice if tools and choice else "auto")
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = _string(choice.get("name"), "tool_choice.name", "tool_choice")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise BadRequest(f"tool_choice.name: no function tool named {name!r}",
                             param="tool_choice")
        return ToolChoice("function", name)
    raise BadRequest('tool_choice must be "auto", "none", "required" or '
                     '{"type": "function", "name": ...}', param="tool_choice")


def _text_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` when it asks for JSON (None: absent, or plain text)."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest("text must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object", param="text.format")
    kind = fmt.get("type")
    if kind in ("json_schema", "json_object"):
        return fmt
    if kind == "text":
        return None
    raise BadRequest("text.format.type must be one of 'text', 'json_object', 'json_schema'",
                     param="text.format.type")


def _grammar(body: dict[str, Any], fmt: dict[str, Any] | None) -> GrammarRequest | None:
    """``text.format`` as a grammar; without one, the ``response_format`` extension."""
    if fmt is None:
        return response_format_request(body.get("response_format"))
    if fmt["type"] == "json_object":
        return GrammarRequest("json_object")
    return GrammarRequest("json_schema", json_schema(fmt.get("schema"), "text.format"))


def conversation(body: dict[str, Any],
                 stored: dict[str, Any] | None) -> tuple[str, list[dict[str, Any]]]:
    """The system text and the whole conversation (``stored`` history, then this
    body's ``input``) as chat messages: what the store keeps for a continuation."""
    if "input" not in body:
        raise BadRequest("input is required", param="input")
    sys_items, new = translate_input(body["input"])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions must be a string", param="instructions")
    if instructions is None and stored:
        instructions = stored.get("system") or None
    system = "\n\n".join(t for t in [instructions or ""] + sys_items if t)
    convo: list[dict[str, Any]] = (stored or {}).get("messages", []) + new
    if not convo:
        raise BadRequest("input has no messages", param="input")
    return system, convo


def _limit(body: dict[str, Any]) -> tuple[object, str]:
    """The completion limit and its name: ``max_output_tokens``, else ``max_tokens``."""
    if "max_output_tokens" in body:
        return body["max_output_tokens"], "max_output_tokens"
    return body.get("max_tokens"), "max_tokens"


def _effort(body: dict[str, Any]) -> tuple[object, str]:
    """The effort and its name: the ``reasoning_effort`` extension, else ``reasoning.effort``."""
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise BadRequest("reasoning must be an object", param="reasoning")
    if body.get("reasoning_effort") is None and reasoning and reasoning.get("effort") is not None:
        return reasoning["effort"], "reasoning.effort"
    return body.get("reasoning_effort"), "reasoning_effort"


def check_flags(body: dict[str, Any]) -> None:
    """``stream`` and ``store`` are booleans (checked before the history is looked up)."""
    for name in ("stream", "store"):  # (stream: mlx_lm.server's words)
        boolean_field(body.get(name), name, mlx_lm=name == "stream")


def parse_request(body: dict[str, Any], stored: dict[str, Any] | None = None,
                  defaults: dict[str, Any] | None = None,
                  server_max_tokens: int | None = None) -> ChatRequest:
    """A Responses body (continuing ``stored``) as the engine's typed chat request; its
    ``surface_state`` carries the system text and conversation the store keeps."""
    check_flags(body)
    system, convo = conversation(body, stored)
    effort = _effort(body)
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    fmt = _text_format(body)

    stream = boolean_field(body.get("stream"), "stream", mlx_lm=True)
    adapter = string_field(body.get("adapter"), "adapter", mlx_lm=True)
    options = GenerateOptions(
        sampling=SamplingParams.from_body(body, defaults, "responses"),
        max_tokens=max_tokens_field(*_limit(body), server_max_tokens),
        stop=stop_sequences(body), grammar=_grammar(body, fmt), budget_close=budget_close(body),
        stream=stream, adapter=adapter, speculation=speculation_field(body))
    tools = check_tools(tools)
    parallel = parse_parallel(body.get("parallel_tool_calls"))
    kwargs = template_kwargs_field(body.get("chat_template_kwargs"))
    messages = ([{"role": "system", "content": system}] if system else []) + convo
    typed = chat_request(options, messages, tools=tools, choice=choice, parallel=parallel,
                         template_kwargs=kwargs, reasoning_effort=check_reasoning_effort(*effort),
                         name="input")
    typed.prompt_cache_key = string_field(body.get("prompt_cache_key"), "prompt_cache_key")
    typed.surface_state.update(system=system, convo=convo)  # what the store keeps
    return typed
