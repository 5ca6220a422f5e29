"""POST /v1/completions — raw text completion, no chat template."""

from __future__ import annotations

from blacksheep import Request

from ..events import Content, Reasoning
from . import generation
from .common import guarded, sse_data
from .openai_chat import openai_stream_error


class CompletionFrames(generation.FrameWriter):
    def __init__(self, run, model_id: str):
        self.head = {"id": run.id, "object": "text_completion", "created": run.created,
                     "model": model_id}

    def chunk(self, text, finish=None, **extra) -> bytes:
        return sse_data({**self.head, "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                                   "logprobs": None}], **extra})

    def event(self, ev):
        return [self.chunk(ev.text)] if isinstance(ev, (Content, Reasoning)) else []

    def done(self, finish):
        return [self.chunk("", finish.reason, usage=finish.usage.openai()), b"data: [DONE]\n\n"]

    def failed(self, message):
        return [openai_stream_error(message)]


def register(app, engine):
    model_id = engine.model.id

    def answer(run, reply) -> dict:
        choice = {"index": 0, "text": reply.content, "finish_reason": reply.finish.reason}
        if reply.finish.logprobs is not None:
            choice["logprobs"] = {"content": reply.finish.logprobs}
        return {"id": run.id, "object": "text_completion", "created": run.created,
                "model": model_id, "choices": [choice], "usage": reply.finish.usage.openai()}

    @guarded()
    async def completions(request: Request):
        run = await generation.start(request, engine, route="/v1/completions", id_prefix="cmpl-",
                                     parse=engine.parse_completion)
        return await generation.respond(request, run, lambda r: CompletionFrames(r, model_id),
                                        answer)

    app.router.add_post("/v1/completions", completions)
