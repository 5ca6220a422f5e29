"""POST /v1/completions — raw text completion, no chat template."""

from __future__ import annotations

import time

from blacksheep import Request

from ..engine.reply import gather
from . import trace as tracing
from .common import collect, guarded, json_response, new_id, now, read_body, sse_data, sse_response


def register(app, engine):
    model_id = engine.model.id

    @guarded()
    async def completions(request: Request):
        cid, created = new_id("cmpl-"), now()
        trace = tracing.begin(request, "/v1/completions", cid)
        t, stage = time.perf_counter(), "body_parse"
        try:
            body = await read_body(request)
            trace.span("request.body_parse", t)
            t, stage = time.perf_counter(), "prepare_completion"
            prepared = await engine.aprepare_completion(body)
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
