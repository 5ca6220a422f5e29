"""POST /v1/chat/completions — the OpenAI chat surface."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ...events import (
    Content,
    Event,
    Finish,
    Reasoning,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolCallWithdrawn,
    Usage,
)
from .. import generation
from ..common import guarded, sse_data
from . import choices

if TYPE_CHECKING:
    from ...engine.core import Engine
    from ...engine.reply import Reply
    from ..generation import Run
    from ..state import App


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}
    if index is not None:
        out["index"] = index
    return out


def openai_stream_error(message: str) -> bytes:
    """The in-stream error frame of both OpenAI generation surfaces."""
    return sse_data({"error": {"message": message, "type": "server_error"}})


class ChatFrames(choices.ChoiceFrames):
    """One choice's chunks. Log-prob entries wait for the next chunk that carries text
    (a token's text can be held back: a partial character, a possible stop sequence,
    tool markup), so every entry is sent exactly once, in order.

    A tool call streams as OpenAI streams one: a first ``tool_calls`` delta with its
    index, id, type, name and empty arguments, then ``function.arguments`` pieces. A
    streamed call that is withdrawn (the budget cut it) is named by index in the last
    chunk's ``withdrawn_tool_calls``, next to its ``finish_reason``."""

    def __init__(self, run: Run, model_id: str, index: int = 0, n: int = 1) -> None:
        super().__init__(index, n)
        self.head = {"id": run.id, "object": "chat.completion.chunk", "created": run.created,
                     "model": model_id}
        self.calls = 0
        self.streaming: dict[str, int] = {}  # streamed call id -> its index
        self.withdrawn: list[int] = []
        self.pending: list[dict[str, Any]] = []  # log-prob entries not sent yet

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: object) -> bytes:
        choice: dict[str, Any] = {"index": self.index, "delta": delta, "finish_reason": finish}
        if finish is not None and self.withdrawn:
            choice["withdrawn_tool_calls"] = self.withdrawn
        if self.pending:
            choice["logprobs"] = {"content": self.pending}
            self.pending = []
        return sse_data({**self.head, "choices": [choice], **extra})

    def opening(self) -> list[bytes]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def event(self, ev: Event) -> list[bytes]:
        if isinstance(ev, TokenLogprob):
            self.pending.append(ev.entry)
            return []
        if isinstance(ev, Content):
            return [self.chunk({"content": ev.text})]
        if isinstance(ev, Reasoning):
            return [self.chunk({"reasoning": ev.text})]
        if isinstance(ev, ToolCallEvent):
            if ev.call.id in self.streaming:
                return []  # every piece of it went out already
            self.calls += 1
            return [self.chunk({"tool_calls": [tool_call_json(ev.call, self.calls - 1)]})]
        return self.call_stream(ev)

    def call_stream(self, ev: Event) -> list[bytes]:
        """A call as it is written: its head, its argument pieces, or its withdrawal."""
        if isinstance(ev, ToolCallStart):
            self.streaming[ev.call_id] = self.calls
            self.calls += 1
            head = tool_call_json(ToolCall(ev.name, "", ev.call_id), self.calls - 1)
            return [self.chunk({"tool_calls": [head]})]
        if isinstance(ev, ToolCallDelta) and ev.call_id in self.streaming:
            piece = {"index": self.streaming[ev.call_id], "function": {"arguments": ev.text}}
            return [self.chunk({"tool_calls": [piece]})]
        if isinstance(ev, ToolCallWithdrawn) and ev.call_id in self.streaming:
            self.withdrawn.append(self.streaming[ev.call_id])
        return []

    def done(self, finish: Finish) -> list[bytes]:
        if self.n > 1:  # the usage comes once, after every choice (summary)
            return [self.chunk({}, finish.reason)]
        return [self.chunk({}, finish.reason, usage=finish.usage.openai()), b"data: [DONE]\n\n"]

    def summary(self, usage: Usage) -> list[bytes]:
        return [sse_data({**self.head, "choices": [], "usage": usage.openai()}),
                b"data: [DONE]\n\n"]

    def failed(self, message: str) -> list[bytes]:
        return [openai_stream_error(message)]


def message_of(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant",
               "content": None if reply.tool_calls and not reply.content.strip() else reply.content}
    if reply.reasoning:
        message["reasoning"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [tool_call_json(c) for c in reply.tool_calls]
    return message


def register(app: App, engine: Engine) -> None:
    model_id = engine.model.id

    def answer(run: Run, replies: list[Reply], usage: Usage) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for index, reply in enumerate(replies):
            choice: dict[str, Any] = {"index": index, "message": message_of(reply),
                      "finish_reason": reply.finish.reason}
            if reply.finish.logprobs is not None:
                choice["logprobs"] = {"content": reply.finish.logprobs}
            out.append(choice)
        return {"id": run.id, "object": "chat.completion", "created": run.created,
                "model": model_id, "choices": out, "usage": usage.openai()}

    @guarded()
    async def chat_completions(request: Request) -> Response:
        run = await generation.start(request, engine, route="/v1/chat/completions",
                                     id_prefix="chatcmpl-", parse=engine.parse_chat)
        return await choices.respond(request, run,
                                     lambda r, i, n: ChatFrames(r, model_id, i, n), answer)

    app.router.add_post("/v1/chat/completions", chat_completions)
