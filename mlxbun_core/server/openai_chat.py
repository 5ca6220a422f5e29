"""POST /v1/chat/completions — the OpenAI chat surface."""

from __future__ import annotations

from blacksheep import Request

from ..events import Content, Reasoning, ToolCallEvent
from . import generation
from .common import guarded, sse_data


def tool_call_json(call, index=None) -> dict:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}
    if index is not None:
        out["index"] = index
    return out


def openai_stream_error(message: str) -> bytes:
    """The in-stream error frame of both OpenAI generation surfaces."""
    return sse_data({"error": {"message": message, "type": "server_error"}})


class ChatFrames(generation.FrameWriter):
    def __init__(self, run, model_id: str):
        self.head = {"id": run.id, "object": "chat.completion.chunk", "created": run.created,
                     "model": model_id}
        self.calls = 0

    def chunk(self, delta, finish=None, **extra) -> bytes:
        return sse_data({**self.head, "choices": [{"index": 0, "delta": delta,
                                                   "finish_reason": finish}], **extra})

    def opening(self):
        return [self.chunk({"role": "assistant", "content": ""})]

    def event(self, ev):
        if isinstance(ev, Content):
            return [self.chunk({"content": ev.text})]
        if isinstance(ev, Reasoning):
            return [self.chunk({"reasoning": ev.text})]
        if isinstance(ev, ToolCallEvent):
            self.calls += 1
            return [self.chunk({"tool_calls": [tool_call_json(ev.call, self.calls - 1)]})]
        return []

    def done(self, finish):
        return [self.chunk({}, finish.reason, usage=finish.usage.openai()), b"data: [DONE]\n\n"]

    def failed(self, message):
        return [openai_stream_error(message)]


def register(app, engine):
    model_id = engine.model.id

    def answer(run, reply) -> dict:
        message = {"role": "assistant",
                   "content": None if reply.tool_calls and not reply.content.strip() else reply.content}
        if reply.reasoning:
            message["reasoning"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [tool_call_json(c) for c in reply.tool_calls]
        choice = {"index": 0, "message": message, "finish_reason": reply.finish.reason}
        if reply.finish.logprobs is not None:
            choice["logprobs"] = {"content": reply.finish.logprobs}
        return {"id": run.id, "object": "chat.completion", "created": run.created,
                "model": model_id, "choices": [choice], "usage": reply.finish.usage.openai()}

    @guarded()
    async def chat_completions(request: Request):
        run = await generation.start(request, engine, route="/v1/chat/completions",
                                     id_prefix="chatcmpl-", parse=engine.parse_chat)
        return await generation.respond(request, run, lambda r: ChatFrames(r, model_id), answer)

    app.router.add_post("/v1/chat/completions", chat_completions)
