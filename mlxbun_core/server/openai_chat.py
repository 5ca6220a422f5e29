"""POST /v1/chat/completions — the OpenAI chat surface."""

from __future__ import annotations

from blacksheep import Request

from ..engine.reply import gather
from . import trace as tracing
from .common import KEEPALIVE, collect, guarded, json_response, sse_data, sse_response


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
        run = await tracing.start(request, "/v1/chat/completions", "chatcmpl-", engine.aprepare_chat, engine)
        cid, created, job, headers = run.id, run.created, run.job, run.headers
        if run.body.get("stream"):
            frames = tracing.traced(stream(job, cid, created), run.trace, job, run.started)
            return sse_response(request, job, frames, headers)
        try:
            reply = gather(await collect(request, engine, job))
        finally:
            run.trace.complete(job, run.started)
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
