"""The Anthropic Messages request, translated into the OpenAI chat body shape.

Every nested field is type-checked on the way (a wrong type is a 400 naming the
field, never a crash); prior-turn thinking blocks are dropped. The system side
(``system``, system-role messages, thinking and effort) is :mod:`.anthropic_system`,
tools and tool search :mod:`.anthropic_tools`. :func:`chat_names` maps chat field
names back to the Anthropic ones for errors the shared chat path raises.
"""

from __future__ import annotations

import json

from ..errors import BadRequest
from . import anthropic_system as system
from .anthropic_tools import ToolSet, reference_text, tool_choice, tool_set

# mlx-lm sampler/penalty extensions accepted on top of Anthropic's own fields
EXTRAS = ("min_p", "xtc_probability", "xtc_threshold", "repetition_penalty",
          "repetition_context_size", "presence_penalty", "presence_context_size",
          "frequency_penalty", "frequency_context_size", "seed", "chat_template_kwargs",
          "reasoning_effort", "response_format", "adapter", "budget_close")
AUDIO_BLOCKS = ("input_audio", "audio", "audio_url")
ROLES = ("user", "assistant", "system")


def _string(value, where: str, *, required: bool = True) -> str:
    if isinstance(value, str) and (value or not required):
        return value
    raise BadRequest(f"{where} must be a {'non-empty ' if required else ''}string")


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object")
    return value


def _image_part(block: dict) -> dict:
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


def _block_part(block) -> dict | None:
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


def _result_part(block, tools: ToolSet) -> dict | None:
    if isinstance(block, dict) and block.get("type") == "tool_reference":
        return {"type": "text", "text": reference_text(block, tools)}
    return _block_part(block)


def _tool_result(block: dict, tools: ToolSet) -> dict:
    content = block.get("content")
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


def _user_messages(content, tools: ToolSet) -> list:
    """A user turn: tool_result blocks become tool messages, the rest user parts."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out, parts = [], []
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


def _assistant_message(content) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
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
    msg = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _output_format(chat: dict, body: dict) -> None:
    config = body.get("output_config")
    config = {} if config is None else _object(config, "output_config")
    where = "output_config.format" if config.get("format") is not None else "output_format"
    fmt = config.get("format", body.get("output_format"))  # current / older beta spelling
    if fmt is None:
        return
    if _object(fmt, where).get("type") != "json_schema":
        raise BadRequest(f"{where}.type must be json_schema")
    chat["response_format"] = {"type": "json_schema",
                               "json_schema": {"name": "output", "schema": fmt.get("schema")}}


def to_chat(body: dict, *, need_max_tokens: bool = True) -> dict:
    """Translate an Anthropic Messages body into an OpenAI chat body."""
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("stream must be a boolean")
    if "logit_bias" in body:
        raise BadRequest("logit_bias is not a parameter of the Anthropic Messages API")
    if need_max_tokens and body.get("max_tokens") is None:
        raise BadRequest("max_tokens: field required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: field required (a non-empty list)")
    tools = tool_set(body.get("tools"))
    out, turn_effort = _messages(body, messages, tools)
    chat = {"messages": out}
    for src, dst in (("stream", "stream"), ("max_tokens", "max_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("top_k", "top_k"), ("stop_sequences", "stop")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    for name in EXTRAS:
        if body.get(name) is not None:
            chat[name] = body[name]
    choice, parallel = tool_choice(body.get("tool_choice"), tools.chat_tools)
    if tools.chat_tools:
        chat["tools"] = tools.chat_tools
        if choice is not None:
            chat["tool_choice"] = choice
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    effort = turn_effort or system.top_effort(body)
    if effort is not None:
        chat.setdefault("reasoning_effort", effort)
    system.thinking_kwargs(chat, body.get("thinking"))
    _output_format(chat, body)
    return chat


def _messages(body: dict, messages: list, tools: ToolSet) -> tuple[list, str | None]:
    """The chat messages, and the effort a system message set for the turn being generated
    (one after the last assistant turn)."""
    out = []
    if body.get("system") is not None:
        prompt = system.system_prompt(body["system"])
        if prompt:
            out.append({"role": "system", "content": prompt})
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    last = {role: i for i, role in enumerate(roles)}  # each role's last position
    turn_effort = None
    for i, m in enumerate(messages):
        if roles[i] not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of user, assistant, system")
        if roles[i] == "system":
            msg, effort = system.system_message(m, i, last.get("user", -1) > i)
            out += [msg] if msg else []
            if effort is not None and last.get("assistant", -1) < i:
                turn_effort = effort
            continue
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise BadRequest("message content must be a string or a list of content blocks")
        out += _user_messages(content, tools) if m["role"] == "user" else \
            [_assistant_message(content)]
    if "user" not in last and "assistant" not in last:
        raise BadRequest("messages needs a user or assistant message, not only system ones")
    return out, turn_effort


def chat_names(body: dict) -> dict:
    """Chat body field → the Anthropic field it came from (for error messages)."""
    names = {"stop": "stop_sequences"}
    config = body.get("output_config") if isinstance(body.get("output_config"), dict) else {}
    if body.get("reasoning_effort") is None:
        names["reasoning_effort"] = "output_config.effort"
    if body.get("response_format") is None:
        fmt = "output_config.format" if config.get("format") is not None else "output_format"
        names.update({"response_format.json_schema": fmt, "response_format": fmt})
    return names
