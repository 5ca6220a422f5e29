"""POST /v1/chat/completions — the OpenAI chat surface."""

from __future__ import annotations

import time

from blacksheep import Request

from ..engine.reply import gather
from . import trace as tracing
from .common import (collect, guarded, json_response, new_id, now, read_body, sse_data,
                     sse_response, KEEPALIVE)


def tool_call_json(call, index=None) -> dict:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}
    if index is not None:
        out["index"] = index
    return out


def register(app, engine):
    model_id = engine.model.id

    @guarded()
    async def chat_completions(request: Request):
        cid, created = new_id("chatcmpl-"), now()
        trace = tracing.begin(request, "/v1/chat/completions", cid)
        t, stage = time.perf_counter(), "body_parse"
        try:
            body = await read_body(request)
            trace.span("request.body_parse", t)
            t, stage = time.perf_counter(), "prepare_completion"
            prepared = await engine.aprepare_chat(body)
            trace.span("request.prompt_prepare", t, prompt_tokens=len(prepared.request.prompt_tokens))
            job = engine.start(prepared.request)
        except Exception as exc:
            trace.finish("error", stage=stage, error=str(exc))
            raise
        started = time.perf_counter()
        headers = {"Warning": prepared.warning} if prepared.warning else None
        if body.get("stream"):
            frames = tracing.traced(stream(job, cid, created), trace, job, started)
            return sse_response(request, job, frames, headers)
        try:
            reply = gather(await collect(request, engine, job))
        finally:
            trace.complete(job, started)
        message = {"role": "assistant",
                   "content": None if reply.tool_calls and not reply.content.strip() else reply.content}
        if reply.reasoning:
            message["reasoning"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [tool_call_json(c) for c in reply.tool_calls]
        choice = {"index": 0, "message": message, "finish_reason": reply.finish.reason}
        if reply.finish.logprobs is not None:
            choice["logprobs"] = {"content": reply.finish.logprobs}
        return json_response({"id": cid, "object": "chat.completion", "created": created,
                              "model": model_id, "choices": [choice],
                              "usage": reply.finish.usage.openai()}, headers=headers)

    async def stream(job, cid, created):
        def chunk(delta, finish=None, **extra):
            return sse_data({"id": cid, "object": "chat.completion.chunk", "created": created,
                             "model": model_id,
                             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                             **extra})

        yield chunk({"role": "assistant", "content": ""})
        calls = 0
        async for kind, payload in engine.events(job):
            if kind == "content":
                yield chunk({"content": payload})
            elif kind == "reasoning":
                yield chunk({"reasoning": payload})
            elif kind == "tool_call":
                yield chunk({"tool_calls": [tool_call_json(payload, calls)]})
                calls += 1
            elif kind == "keepalive":
                yield KEEPALIVE
            elif kind == "done":
                if payload.reason in ("error", "cancelled"):
                    yield sse_data({"error": {"message": payload.error or "generation cancelled",
                                              "type": "server_error"}})
                    return
                yield chunk({}, payload.reason, usage=payload.usage.openai())
        yield b"data: [DONE]\n\n"

    app.router.add_post("/v1/chat/completions", chat_completions)
