"""POST /v1/completions — raw text completion, no chat template."""

from __future__ import annotations

from blacksheep import Request

from ..engine.reply import gather
from . import trace as tracing
from .common import collect, guarded, json_response, sse_data, sse_response


def register(app, engine):
    model_id = engine.model.id

    @guarded()
    async def completions(request: Request):
        run = await tracing.start(request, "/v1/completions", "cmpl-", engine.aprepare_completion, engine)
        cid, created, job, headers = run.id, run.created, run.job, run.headers
        if run.body.get("stream"):
            frames = tracing.traced(stream(job, cid, created), run.trace, job, run.started)
            return sse_response(request, job, frames, headers)
        try:
            reply = gather(await collect(request, engine, job))
        finally:
            run.trace.complete(job, run.started)
        choice = {"index": 0, "text": reply.content, "finish_reason": reply.finish.reason}
        if reply.finish.logprobs is not None:
            choice["logprobs"] = {"content": reply.finish.logprobs}
        return json_response({"id": cid, "object": "text_completion", "created": created,
                              "model": model_id, "choices": [choice],
                              "usage": reply.finish.usage.openai()}, headers=headers)

    async def stream(job, cid, created):
        def chunk(text, finish=None, **extra):
            return sse_data({"id": cid, "object": "text_completion", "created": created,
                             "model": model_id,
                             "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                          "logprobs": None}], **extra})

        async for kind, payload in engine.events(job):
            if kind in ("content", "reasoning"):
                yield chunk(payload)
            elif kind == "done":
                if payload.reason in ("error", "cancelled"):
                    yield sse_data({"error": {"message": payload.error or "generation cancelled",
                                              "type": "server_error"}})
                    return
                yield chunk("", payload.reason, usage=payload.usage.openai())
        yield b"data: [DONE]\n\n"

    app.router.add_post("/v1/completions", completions)
