"""POST /v1/messages (+ /v1/messages/count_tokens) — the Anthropic Messages surface.

The request is translated into the OpenAI chat body shape and runs through the
same ``engine.prepare_chat`` path as /v1/chat/completions, so templates, tool
parsing, media checks and grammar are shared; only the wire format differs.

Reasoning is surfaced as Anthropic's extended-thinking shape: a ``thinking``
block (empty ``signature``; we sign nothing) before the text, present only when
the model actually thought. Prior-turn thinking blocks are dropped on re-ingest.
``usage.input_tokens`` follows Anthropic's meaning: the prompt tokens NOT read
from the prompt cache; ``cache_read_input_tokens`` (present only when the cache
contributed) holds the rest.
"""

from __future__ import annotations

import json

from blacksheep import Request

from ..engine.reply import gather
from ..errors import APIError, BadRequest
from .common import collect, guarded, json_response, new_id, read_body, sse_event, sse_response

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# mlx-lm sampler/penalty extensions accepted on top of Anthropic's own fields
EXTRAS = ("min_p", "xtc_probability", "xtc_threshold", "repetition_penalty",
          "repetition_context_size", "presence_penalty", "presence_context_size",
          "frequency_penalty", "frequency_context_size", "seed", "chat_template_kwargs",
          "reasoning_effort", "response_format")
AUDIO_BLOCKS = ("input_audio", "audio", "audio_url")
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_error(exc: APIError):
    kind = ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return json_response({"type": "error", "error": {"type": kind, "message": exc.message}},
                         exc.status)


# ---------------------------------------------------------------- request side

def _text_of(content, where: str) -> str:
    """A string, or the text blocks of a block list (system, tool_result)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks")
    return "".join(b.get("text", "") for b in content
                   if isinstance(b, dict) and b.get("type") == "text")


def _image_part(block: dict) -> dict:
    src = block.get("source") or {}
    kind = src.get("type")
    if kind == "base64" and isinstance(src.get("data"), str):
        url = f"data:{src.get('media_type') or 'image/png'};base64,{src['data']}"
    elif kind == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise BadRequest(f"unsupported image source type: {kind!r} (use base64 or url)")
    return {"type": "image_url", "image_url": {"url": url}}


def _block_part(block) -> dict | None:
    """One user-side content block as an OpenAI content part (None = dropped)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
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
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": parts}


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
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block.get("name", ""),
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadRequest(f"unsupported assistant content block type: {kind!r}")
    msg = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tools(tools) -> list | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    out = [{"type": "function",
            "function": {"name": t["name"], "description": t.get("description", ""),
                         "parameters": t["input_schema"]}}
           for t in tools if isinstance(t, dict) and t.get("name") and t.get("input_schema")]
    return out or None


def _tool_choice(choice):
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if mapped is None:
        raise BadRequest("tool_choice.type must be one of auto, any, tool, none")
    return mapped


def to_chat(body: dict, *, need_max_tokens: bool = True) -> dict:
    """Translate an Anthropic Messages body into an OpenAI chat body."""
    if "logit_bias" in body:
        raise BadRequest("logit_bias is not a parameter of the Anthropic Messages API")
    if need_max_tokens and body.get("max_tokens") is None:
        raise BadRequest("max_tokens: field required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: field required (a non-empty list)")
    out = []
    if body.get("system") is not None:
        system = _text_of(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest("each message needs role 'user' or 'assistant'")
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise BadRequest("message content must be a string or a list of content blocks")
        out += _user_messages(content) if m["role"] == "user" else [_assistant_message(content)]
    chat = {"messages": out, "stream": bool(body.get("stream"))}
    for src, dst in (("max_tokens", "max_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("top_k", "top_k"), ("stop_sequences", "stop")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    for name in EXTRAS:
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        kwargs = dict(chat.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", thinking["type"] == "enabled")
        chat["chat_template_kwargs"] = kwargs
    config = body.get("output_config") if isinstance(body.get("output_config"), dict) else {}
    if config.get("effort") is not None:  # Anthropic's top level "max" is our "xhigh"
        chat.setdefault("reasoning_effort", {"max": "xhigh"}.get(config["effort"], config["effort"]))
    fmt = config.get("format") or body.get("output_format")  # current / older beta spelling
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": fmt.get("schema")}}
    return chat


# ---------------------------------------------------------------- response side

def _usage(usage, *, output: bool = True) -> dict:
    out = {"input_tokens": usage.prompt_tokens - usage.cached_tokens}
    if usage.cached_tokens > 0:
        out["cache_read_input_tokens"] = usage.cached_tokens
    if output:
        out["output_tokens"] = usage.completion_tokens
    return out


def _stop(finish) -> tuple[str, str | None]:
    if finish.stop_sequence:
        return "stop_sequence", finish.stop_sequence
    return STOP_REASONS.get(finish.reason, "end_turn"), None


def _tool_use(call) -> dict:
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        args = {}
    return {"type": "tool_use", "id": call.id, "name": call.name,
            "input": args if isinstance(args, dict) else {}}


def register(app, engine):
    model_id = engine.model.id

    @guarded(anthropic_error)
    async def messages(request: Request):
        body = await read_body(request)
        prepared = await engine.aprepare_chat(to_chat(body))
        job = engine.start(prepared.request)
        headers = {"Warning": prepared.warning} if prepared.warning else None
        mid = new_id("msg_")
        if body.get("stream"):
            frames = stream(job, mid, len(prepared.request.prompt_tokens))
            return sse_response(request, job, frames, headers)
        reply = gather(await collect(request, engine, job))
        content = []
        if reply.reasoning:
            content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
        if reply.content.strip() or (reply.content and not reply.tool_calls):
            content.append({"type": "text", "text": reply.content})
        content += [_tool_use(c) for c in reply.tool_calls]
        if not content:
            content.append({"type": "text", "text": ""})
        reason, seq = _stop(reply.finish)
        return json_response({"id": mid, "type": "message", "role": "assistant",
                              "model": model_id, "content": content, "stop_reason": reason,
                              "stop_sequence": seq, "usage": _usage(reply.finish.usage)},
                             headers=headers)

    async def stream(job, mid, prompt_tokens):
        yield sse_event("message_start", {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": model_id,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})
        index, open_kind, pending = -1, None, ""  # pending: leading whitespace of a text block

        def start(kind, block):
            nonlocal index, open_kind
            frames = list(stop())
            index += 1
            open_kind = kind
            frames.append(sse_event("content_block_start", {
                "type": "content_block_start", "index": index, "content_block": block}))
            return frames

        def stop():
            nonlocal open_kind
            if open_kind is None:
                return []
            open_kind = None
            return [sse_event("content_block_stop", {"type": "content_block_stop", "index": index})]

        def delta(d):
            return sse_event("content_block_delta",
                             {"type": "content_block_delta", "index": index, "delta": d})

        def text(t):
            frames = [] if open_kind == "text" else start("text", {"type": "text", "text": ""})
            return frames + [delta({"type": "text_delta", "text": t})]

        async for kind, payload in engine.events(job):
            frames = []
            if kind == "reasoning" and payload:
                if open_kind != "thinking":
                    frames += start("thinking", {"type": "thinking", "thinking": "",
                                                 "signature": ""})
                frames.append(delta({"type": "thinking_delta", "thinking": payload}))
            elif kind == "content" and payload:
                if open_kind != "text" and not (pending + payload).strip():
                    pending += payload  # whitespace before a tool call is not a block
                else:
                    frames += text(pending + payload)
                    pending = ""
            elif kind == "tool_call":
                pending = ""
                frames += start("tool_use", {"type": "tool_use", "id": payload.id,
                                             "name": payload.name, "input": {}})
                frames.append(delta({"type": "input_json_delta",
                                     "partial_json": payload.arguments or "{}"}))
                frames += stop()
            elif kind == "keepalive":
                frames.append(sse_event("ping", {"type": "ping"}))
            elif kind == "done":
                if payload.reason in ("error", "cancelled"):
                    yield sse_event("error", {"type": "error", "error": {
                        "type": "api_error", "message": payload.error or "generation cancelled"}})
                    return
                if pending or index < 0:
                    frames += text(pending)
                frames += stop()
                reason, seq = _stop(payload)
                frames.append(sse_event("message_delta", {
                    "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": _usage(payload.usage)}))
                frames.append(sse_event("message_stop", {"type": "message_stop"}))
            for frame in frames:
                yield frame

    @guarded(anthropic_error)
    async def count_tokens(request: Request):
        body = await read_body(request)
        prepared = await engine.aprepare_chat(to_chat(body, need_max_tokens=False))
        return json_response({"input_tokens": len(prepared.request.prompt_tokens)})

    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
