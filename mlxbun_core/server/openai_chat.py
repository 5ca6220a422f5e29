"""POST /v1/chat/completions — the OpenAI chat surface."""

from __future__ import annotations

from blacksheep import Request

from ..engine.reply import gather
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
        body = await read_body(request)
        prepared = await engine.aprepare_chat(body)
        job = engine.start(prepared.request)
        headers = {"Warning": prepared.warning} if prepared.warning else None
        cid, created = new_id("chatcmpl-"), now()
        if body.get("stream"):
            return sse_response(request, job, stream(job, cid, created), headers)
        reply = gather(await collect(request, engine, job))
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
