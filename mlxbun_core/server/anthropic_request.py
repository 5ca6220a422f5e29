"""The Anthropic Messages request, translated into the OpenAI chat body shape.

Every nested field is type-checked on the way (a wrong type is a 400 naming the
field, never a crash); prior-turn thinking blocks are dropped, server tools (a
``type`` other than ``custom``) skipped. :func:`chat_names` maps chat field names
back to the Anthropic ones for errors the shared chat path raises.
"""

from __future__ import annotations

import json

from ..errors import BadRequest

# mlx-lm sampler/penalty extensions accepted on top of Anthropic's own fields
EXTRAS = ("min_p", "xtc_probability", "xtc_threshold", "repetition_penalty",
          "repetition_context_size", "presence_penalty", "presence_context_size",
          "frequency_penalty", "frequency_context_size", "seed", "chat_template_kwargs",
          "reasoning_effort", "response_format", "adapter", "budget_close")
AUDIO_BLOCKS = ("input_audio", "audio", "audio_url")


def _string(value, where: str, *, required: bool = True) -> str:
    if isinstance(value, str) and (value or not required):
        return value
    raise BadRequest(f"{where} must be a {'non-empty ' if required else ''}string")


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object")
    return value


def _system(content) -> str:
    """The system prompt: a string, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest("system must be a string or a list of text blocks")
    texts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise BadRequest(f"system[{i}] must be a text block ({{\"type\": \"text\", ...}})")
        texts.append(_string(block.get("text"), f"system[{i}].text", required=False))
    return "".join(texts)


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


def _tool_result(block: dict) -> dict:
    content = block.get("content")
    if content is None or isinstance(content, str):
        parts = content or ""
    elif isinstance(content, list):
        parts = [p for p in map(_block_part, content) if p is not None]
        if all(p["type"] == "text" for p in parts):
            parts = "".join(p["text"] for p in parts)
    else:
        raise BadRequest("tool_result content must be a string or a list of blocks")
    if block.get("is_error") and isinstance(parts, str):
        parts = f"Error: {parts}"
    return {"role": "tool", "content": parts,
            "tool_call_id": _string(block.get("tool_use_id"), "tool_result tool_use_id")}


def _user_messages(content) -> list:
    """A user turn: tool_result blocks become tool messages, the rest user parts."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out, parts = [], []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block))
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


def _tools(tools) -> list | None:
    """Client tools as chat tools; server tools (a ``type`` other than custom) are skipped."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    out = []
    for i, t in enumerate(tools):
        _object(t, f"tools[{i}]")
        if t.get("type") not in (None, "custom"):
            continue  # web_search, bash, text_editor, …: not ours
        description = t.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(f"tools[{i}].description must be a string")
        fn = {"name": _string(t.get("name"), f"tools[{i}].name"),
              "description": description or "",
              "parameters": _object(t.get("input_schema"), f"tools[{i}].input_schema")}
        if t.get("strict") is not None:
            if not isinstance(t["strict"], bool):
                raise BadRequest(f"tools[{i}].strict must be a boolean")
            fn["strict"] = t["strict"]
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice, tools: list | None) -> tuple:
    """Anthropic's tool_choice as the chat ``(tool_choice, parallel_tool_calls)``."""
    if choice is None:
        return None, None
    if not isinstance(choice, dict):
        raise BadRequest('tool_choice must be an object, e.g. {"type": "auto"}')
    kind = choice.get("type")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("tool_choice.disable_parallel_tool_use must be a boolean")
    parallel = None if parallel is None else not parallel
    if kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise BadRequest(f"tool_choice.name: no tool named {name!r} in tools")
        return {"type": "function", "function": {"name": name}}, parallel
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind) \
        if isinstance(kind, str) else None
    if mapped is None:
        raise BadRequest("tool_choice.type must be one of auto, any, tool, none")
    if mapped == "required" and not tools:
        raise BadRequest('tool_choice {"type": "any"} needs tools')
    return mapped, parallel


def _thinking(chat: dict, thinking) -> None:
    if thinking is None:
        return
    kind = _object(thinking, "thinking").get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise BadRequest("thinking.type must be one of enabled, disabled, adaptive")
    if kind == "adaptive":
        return  # the model's own default
    kwargs = dict(_object(chat.get("chat_template_kwargs", {}), "chat_template_kwargs"))
    kwargs.setdefault("enable_thinking", kind == "enabled")
    chat["chat_template_kwargs"] = kwargs


def _output_config(chat: dict, body: dict) -> None:
    config = body.get("output_config")
    config = {} if config is None else _object(config, "output_config")
    effort = config.get("effort")
    if effort is not None:  # Anthropic's top level "max" is our "xhigh"
        chat.setdefault("reasoning_effort", {"max": "xhigh"}.get(
            _string(effort, "output_config.effort"), effort))
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
    out = []
    if body.get("system") is not None:
        system = _system(body["system"])
        if system:
            out.append({"role": "system", "content": system})
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest("each message needs role 'user' or 'assistant'")
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise BadRequest("message content must be a string or a list of content blocks")
        out += _user_messages(content) if m["role"] == "user" else [_assistant_message(content)]
    chat = {"messages": out}
    for src, dst in (("stream", "stream"), ("max_tokens", "max_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("top_k", "top_k"), ("stop_sequences", "stop")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    for name in EXTRAS:
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = _tools(body.get("tools"))
    choice, parallel = _tool_choice(body.get("tool_choice"), tools)
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    _thinking(chat, body.get("thinking"))
    _output_config(chat, body)
    return chat


def chat_names(body: dict) -> dict:
    """Chat body field → the Anthropic field it came from (for error messages)."""
    names = {"stop": "stop_sequences"}
    config = body.get("output_config") if isinstance(body.get("output_config"), dict) else {}
    if body.get("reasoning_effort") is None and config.get("effort") is not None:
        names["reasoning_effort"] = "output_config.effort"
    if body.get("response_format") is None:
        fmt = "output_config.format" if config.get("format") is not None else "output_format"
        names.update({"response_format.json_schema": fmt, "response_format": fmt})
    return names
