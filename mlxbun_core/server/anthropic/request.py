"""The Anthropic Messages request, parsed straight into the engine's typed chat request.

Every nested field is type-checked on the way (a wrong type is a 400 naming the field
as the client sent it, never a crash); prior-turn thinking blocks are dropped. The
messages become the chat-shaped history every template reads; the other fields go
through the shared validators (:mod:`mlxbun_core.engine.request`,
:mod:`mlxbun_core.engine.sampling`) under their Anthropic names (``max_tokens``,
``stop_sequences``, ``output_config.format``, ``output_config.effort``). The system
side (``system``, system-role messages, thinking and effort) is :mod:`.anthropic_system`,
tools and tool search :mod:`.anthropic_tools`.
"""

from __future__ import annotations

import json
from typing import Any

from ...chat_template import check_reasoning_effort
from ...engine.request import (
    ChatRequest,
    GenerateOptions,
    chat_request,
    string_field,
    template_kwargs_field,
)
from ...engine.sampling import (
    SamplingParams,
    max_tokens_field,
    mlx_lm_type_error,
    stop_sequences,
)
from ...engine.speculate import speculation_field
from ...errors import BadRequest
from ...grammar.request import GrammarRequest, budget_close, json_schema, response_format_request
from . import system
from .cache_control import breakpoints
from .tools import ToolSet, reference_text, tool_choice, tool_set

# the sampler fields (Anthropic's, and the mlx-lm extensions on top) are request_fields'
# rows for "anthropic"; the extensions chat_template_kwargs, reasoning_effort,
# response_format, adapter and budget_close are read under their own names too
AUDIO_BLOCKS = ("input_audio", "audio", "audio_url")
ROLES = ("user", "assistant", "system")


def _string(value: object, where: str, *, required: bool = True) -> str:
    if isinstance(value, str) and (value or not required):
        return value
    raise BadRequest(f"{where} must be a {'non-empty ' if required else ''}string")


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object")
    return value


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    src = _object(block.get("source"), "image source")
    kind = src.get("type")
    if kind == "base64" and isinstance(src.get("data"), str):
        media = src.get("media_type")
        if media is not None and not isinstance(media, str):
            raise BadRequest("image source media_type must be a string")
        url = f"data:{media or 'image/png'};base64,{src['data']}"
    elif kind == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise BadRequest(f"unsupported image source type: {kind!r} (use base64 with a string "
                         "data, or url with a string url)")
    return {"type": "image_url", "image_url": {"url": url}}


def _block_part(block: Any) -> dict[str, Any] | None:
    """One user-side content block as an OpenAI content part (None = dropped)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return {"type": "text", "text": _string(block.get("text"), "text block text",
                                                required=False)}
    if kind == "image":
        return _image_part(block)
    if kind in AUDIO_BLOCKS:
        raise BadRequest("the Anthropic protocol has no audio input block; send audio to "
                         "/v1/chat/completions instead")
    if kind in ("thinking", "redacted_thinking"):
        return None
    raise BadRequest(f"unsupported content block type: {kind!r}")


def _result_part(block: Any, tools: ToolSet) -> dict[str, Any] | None:
    if isinstance(block, dict) and block.get("type") == "tool_reference":
        return {"type": "text", "text": reference_text(block, tools)}
    return _block_part(block)


def _tool_result(block: dict[str, Any], tools: ToolSet) -> dict[str, Any]:
    content = block.get("content")
    parts: Any
    if content is None or isinstance(content, str):
        parts = content or ""
    elif isinstance(content, list):
        parts = [p for p in (_result_part(b, tools) for b in content) if p is not None]
        if all(p["type"] == "text" for p in parts):
            parts = "".join(p["text"] for p in parts)
    else:
        raise BadRequest("tool_result content must be a string or a list of blocks")
    if block.get("is_error") and isinstance(parts, str):
        parts = f"Error: {parts}"
    return {"role": "tool", "content": parts,
            "tool_call_id": _string(block.get("tool_use_id"), "tool_result tool_use_id")}


def _user_messages(content: str | list[Any], tools: ToolSet) -> list[dict[str, Any]]:
    """A user turn: tool_result blocks become tool messages, the rest user parts."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block, tools))
        else:
            part = _block_part(block)
            if part is not None:
                parts.append(part)
    if parts or not out:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_message(content: str | list[Any]) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_string(block.get("text"), "text block text", required=False))
        elif kind == "tool_use":
            args = block.get("input")
            if args is not None and not isinstance(args, dict):
                raise BadRequest("tool_use input must be an object")
            calls.append({"id": _string(block.get("id"), "tool_use id"), "type": "function",
                          "function": {"name": _string(block.get("name"), "tool_use name"),
                                       "arguments": json.dumps(args or {})}})
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadRequest(f"unsupported assistant content block type: {kind!r}")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _output_format(body: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The requested output format and the name it came as (``output_config.format``,
    or the older beta spelling ``output_format``), or None."""
    config = body.get("output_config")
    config = {} if config is None else _object(config, "output_config")
    where = "output_config.format" if config.get("format") is not None else "output_format"
    fmt = config.get("format", body.get("output_format"))  # current / older beta spelling
    if fmt is None:
        return None
    if _object(fmt, where).get("type") != "json_schema":
        raise BadRequest(f"{where}.type must be json_schema")
    return fmt, where


def _grammar(body: dict[str, Any],
             output: tuple[dict[str, Any], str] | None) -> GrammarRequest | None:
    """The output format as a grammar; without one, the ``response_format`` extension."""
    if output is None:
        return response_format_request(body.get("response_format"))
    fmt, where = output
    return GrammarRequest("json_schema", json_schema(fmt.get("schema"), where))


def parse_request(body: dict[str, Any], defaults: dict[str, Any] | None = None,
                  server_max_tokens: int | None = None, *,
                  need_max_tokens: bool = True, cache_control: bool = True) -> ChatRequest:
    """An Anthropic Messages body as the engine's typed chat request (``defaults``: the
    served model's sampling defaults; ``server_max_tokens``: the operator's cap).
    ``need_max_tokens`` is false for count_tokens, which takes a body without it;
    ``cache_control`` false skips the breakpoints (a breakpoint's own variant)."""
    if not isinstance(body.get("stream", False), bool):
        raise mlx_lm_type_error("stream", bool)
    if "logit_bias" in body:
        raise BadRequest("logit_bias is not a parameter of the Anthropic Messages API")
    if need_max_tokens and body.get("max_tokens") is None:
        raise BadRequest("max_tokens: field required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: field required (a non-empty list)")
    tools = tool_set(body.get("tools"))
    history, turn_effort = _messages(body, messages, tools)
    choice, parallel = tool_choice(body.get("tool_choice"), tools.chat_tools)
    effort = _effort(body, turn_effort)
    kwargs = system.thinking_kwargs(body.get("chat_template_kwargs"), body.get("thinking"))
    output = _output_format(body)

    adapter = string_field(body.get("adapter"), "adapter", mlx_lm=True)
    options = GenerateOptions(
        sampling=SamplingParams.from_body(body, defaults, "anthropic"),
        max_tokens=max_tokens_field(body.get("max_tokens"), "max_tokens", server_max_tokens),
        stop=stop_sequences(body, "stop_sequences"), grammar=_grammar(body, output),
        budget_close=budget_close(body), stream=body.get("stream", False), adapter=adapter,
        speculation=speculation_field(body))
    req = chat_request(options, history, tools=tools.chat_tools, choice=choice,
                       parallel=True if parallel is None else parallel,
                       template_kwargs=template_kwargs_field(kwargs),
                       reasoning_effort=check_reasoning_effort(*effort))
    if cache_control:
        req.cache_breakpoints = breakpoints(body, lambda variant: parse_request(
            variant, defaults, server_max_tokens, need_max_tokens=need_max_tokens,
            cache_control=False))
    return req


def _effort(body: dict[str, Any], turn_effort: tuple[str, str] | None) -> tuple[str | None, str]:
    """The effort for the turn being generated and the field it came from: the
    ``reasoning_effort`` extension, else a system message's for this turn, else the
    top-level ``output_config.effort``."""
    effort = turn_effort or (system.top_effort(body), "output_config.effort")
    if body.get("reasoning_effort") is not None:
        return body["reasoning_effort"], "reasoning_effort"
    return effort


def _messages(body: dict[str, Any], messages: list[Any],
              tools: ToolSet) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """The chat messages, and the effort a system message set for the turn being generated
    (one after the last assistant turn) with the field it came as."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        prompt = system.system_prompt(body["system"])
        if prompt:
            out.append({"role": "system", "content": prompt})
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    # each role's last position (an unhashable role is refused in the loop below)
    last = {role: i for i, role in enumerate(roles) if isinstance(role, str)}
    turn_effort: tuple[str, str] | None = None
    for i, m in enumerate(messages):
        if roles[i] not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of user, assistant, system")
        if roles[i] == "system":
            msg, effort = system.system_message(m, i, last.get("user", -1) > i)
            out += [msg] if msg else []
            if effort is not None and last.get("assistant", -1) < i:
                turn_effort = effort, f"messages[{i}].output_config.effort"
            continue
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise BadRequest("message content must be a string or a list of content blocks")
        out += _user_messages(content, tools) if m["role"] == "user" else \
            [_assistant_message(content)]
    if "user" not in last and "assistant" not in last:
        raise BadRequest("messages needs a user or assistant message, not only system ones")
    return out, turn_effort
