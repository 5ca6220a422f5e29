"""POST /v1/completions — raw text completion, no chat template.

Log-probs come in the legacy Completions shape (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``), streamed per chunk as well; ``content`` keeps the
per-token entries of chat's shape (mlx_lm.server's block, with ``id``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..engine.logprobs import legacy_block
from ..events import Content, Event, Finish, Reasoning, TokenLogprob, Usage
from . import choices, generation
from .common import guarded, sse_data
from .openai_chat import openai_stream_error

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..engine.reply import Reply
    from .generation import Run
    from .state import App


class CompletionFrames(choices.ChoiceFrames):
    def __init__(self, run: Run, model_id: str, index: int = 0, n: int = 1) -> None:
        super().__init__(index, n)
        self.head = {"id": run.id, "object": "text_completion", "created": run.created,
                     "model": model_id}
        self.pending: list[dict[str, Any]] = []  # log-prob entries not sent yet (see ChatFrames)
        self.offset = 0  # text_offset of the next entry

    def chunk(self, text: str, finish: str | None = None, **extra: object) -> bytes:
        logprobs: dict[str, Any] | None = None
        if self.pending:
            logprobs, self.offset = legacy_block(self.pending, self.offset)
            self.pending = []
        return sse_data({**self.head, "choices": [{"index": self.index, "text": text,
                                                   "finish_reason": finish,
                                                   "logprobs": logprobs}], **extra})

    def event(self, ev: Event) -> list[bytes]:
        if isinstance(ev, TokenLogprob):
            self.pending.append(ev.entry)
            return []
        return [self.chunk(ev.text)] if isinstance(ev, (Content, Reasoning)) else []

    def done(self, finish: Finish) -> list[bytes]:
        if self.n > 1:
            return [self.chunk("", finish.reason)]
        return [self.chunk("", finish.reason, usage=finish.usage.openai()), b"data: [DONE]\n\n"]

    def summary(self, usage: Usage) -> list[bytes]:
        return [sse_data({**self.head, "choices": [], "usage": usage.openai()}),
                b"data: [DONE]\n\n"]

    def failed(self, message: str) -> list[bytes]:
        return [openai_stream_error(message)]


def register(app: App, engine: Engine) -> None:
    model_id = engine.model.id

    def answer(run: Run, replies: list[Reply], usage: Usage) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for index, reply in enumerate(replies):
            choice: dict[str, Any] = {"index": index, "text": reply.content,
                                      "finish_reason": reply.finish.reason}
            if reply.finish.logprobs is not None:
                choice["logprobs"] = legacy_block(reply.finish.logprobs)[0]
            out.append(choice)
        return {"id": run.id, "object": "text_completion", "created": run.created,
                "model": model_id, "choices": out, "usage": usage.openai()}

    @guarded()
    async def completions(request: Request) -> Response:
        run = await generation.start(request, engine, route="/v1/completions", id_prefix="cmpl-",
                                     parse=engine.parse_completion)
        return await choices.respond(request, run,
                                     lambda r, i, n: CompletionFrames(r, model_id, i, n), answer)

    app.router.add_post("/v1/completions", completions)
