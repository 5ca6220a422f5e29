"""POST /v1/messages (+ /v1/messages/count_tokens) — the Anthropic Messages surface.

The request is translated into the OpenAI chat body shape (:mod:`.anthropic_request`)
and runs through the same ``engine.prepare_chat`` path as /v1/chat/completions, so
templates, tool parsing, media checks and grammar are shared; only the wire format
differs.

Reasoning is surfaced as Anthropic's extended-thinking shape: a ``thinking``
block (empty ``signature``; we sign nothing) before the text, present only when
the model actually thought. Prior-turn thinking blocks are dropped on re-ingest.
``usage.input_tokens`` follows Anthropic's meaning: the prompt tokens NOT read
from the prompt cache; ``cache_read_input_tokens`` (present only when the cache
contributed) holds the rest.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

from blacksheep import Request

from ..engine.reply import gather
from ..errors import APIError, BadRequest
from ..grammar import resolve_grammar_request
from .anthropic_request import chat_names, to_chat
from .common import collect, guarded, json_response, new_id, read_body, sse_event, sse_response
from .field_names import renamed

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_error(exc: APIError):
    """Anthropic's error shape has no ``param``: a known one leads the message instead."""
    kind = ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    message = exc.message
    if exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"
    return json_response({"type": "error", "error": {"type": kind, "message": message}},
                         exc.status)


# ---------------------------------------------------------------- request side

@contextmanager
def anthropic_names(body: dict):
    """Errors of the shared chat path, in the Anthropic field names ``body`` used."""
    try:
        yield
    except APIError as exc:
        raise renamed(exc, chat_names(body)) from exc


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
        streaming = body.get("stream", False)
        if not isinstance(streaming, bool):
            raise BadRequest("stream must be a boolean")
        chat = to_chat(body)
        with anthropic_names(body):
            prepared = await engine.aprepare_chat(chat)
        job = engine.start(prepared.request)
        headers = {"Warning": prepared.warning} if prepared.warning else None
        mid = new_id("msg_")
        if streaming:
            return sse_response(request, job, stream(job, mid), headers)
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

    async def stream(job, mid):
        def message_start():
            # sent at once (clients show progress from it); same accounting as message_delta
            usage = {**_usage(job.session.usage, output=False), "output_tokens": 0}
            return sse_event("message_start", {"type": "message_start", "message": {
                "id": mid, "type": "message", "role": "assistant", "model": model_id,
                "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}})

        index, open_kind = -1, None

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

        yield message_start()
        async for kind, payload in engine.events(job):
            frames = []
            if kind == "reasoning" and payload:
                if open_kind != "thinking":
                    frames += start("thinking", {"type": "thinking", "thinking": "",
                                                 "signature": ""})
                frames.append(delta({"type": "thinking_delta", "thinking": payload}))
            elif kind == "content" and payload:
                frames += text(payload)  # the tool parser drops whitespace around a call
            elif kind == "tool_call":
                frames += start("tool_use", {"type": "tool_use", "id": payload.id,
                                             "name": payload.name, "input": {}})
                frames.append(delta({"type": "input_json_delta",
                                     "partial_json": payload.arguments or "{}"}))
                frames += stop()
            elif kind == "keepalive":
                frames.append(sse_event("ping", {"type": "ping"}))
            elif kind == "done":
                if payload.reason in ("error", "cancelled"):
                    for frame in frames:
                        yield frame
                    yield sse_event("error", {"type": "error", "error": {
                        "type": "api_error", "message": payload.error or "generation cancelled"}})
                    return
                if index < 0:
                    frames += text("")
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
        chat = to_chat(body, need_max_tokens=False)
        with anthropic_names(body):
            resolve_grammar_request(chat)  # a bad format is a 400 here too …
            chat.pop("response_format", None)  # … but counting compiles no grammar
            prepared = await engine.aprepare_chat(chat)
        return json_response({"input_tokens": len(prepared.request.prompt_tokens)})

    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
