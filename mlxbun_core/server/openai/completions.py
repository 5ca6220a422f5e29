"""POST /v1/completions — raw text completion, no chat template.

Log-probs come in the legacy Completions shape (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``), streamed per chunk as well; ``content`` keeps the
per-token entries of chat's shape (mlx_lm.server's block, with ``id``).

The legacy request shapes evaluation tools send are read too (engine/completion_request.py):
several prompts (choice ``p * n + i`` is choice ``i`` of prompt ``p``), token-id prompts,
``logprobs`` as an integer top-k, and ``echo``: the prompt's text comes first in ``text``
and, with log-probs, its tokens come first in the block (the first with a null logprob),
scored by the prefill; ``text_offset`` indexes into that whole text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ...engine.logprobs import legacy_block
from ...engine.request import CompletionRequest, Prompt
from ...events import Content, Event, Finish, PromptLogprobs, Reasoning, TokenLogprob, Usage
from .. import generation
from ..common import guarded, sse_data
from . import choices
from .chat import openai_stream_error

if TYPE_CHECKING:
    from ...contract import Tokenizer
    from ...engine.core import Engine
    from ...engine.reply import Reply
    from ..generation import Run
    from ..state import App


def prompt_text(tokenizer: Tokenizer, prompt: Prompt) -> str:
    """What ``echo`` returns for a prompt: its text, or its token ids decoded."""
    return prompt if isinstance(prompt, str) else str(tokenizer.decode(prompt))


def echoes(run: Run, tokenizer: Tokenizer) -> list[str | None]:
    """Per choice, the prompt text it echoes (None: no echo)."""
    req = run.request
    assert isinstance(req, CompletionRequest)  # this surface parses completions only
    if not req.echo:
        return [None] * len(run.gens)
    texts = [prompt_text(tokenizer, p) for p in req.prompts]
    return [texts[i // req.n] for i in range(len(run.gens))]


def echo_block(prompt: list[dict[str, Any]], generated: list[dict[str, Any]],
               echo: str) -> dict[str, Any]:
    """The prompt's entries then the generated ones as one legacy block, ``text_offset``
    indexing into the echoed text and what follows it. Tokens whose text the prompt
    does not show (a BOS the tokenizer added) sit at offset 0."""
    block = legacy_block(prompt + generated)[0]
    offsets = block["text_offset"]
    pieces = "".join(e["token"] for e in prompt)
    lead = len(pieces) - len(echo) if pieces.endswith(echo) else 0
    for i in range(len(prompt)):
        offsets[i] = max(0, offsets[i] - lead)
    offset = len(echo)
    for i, entry in enumerate(generated, start=len(prompt)):
        offsets[i] = offset
        offset += len(entry["token"])
    return block


def request_usage(run: Run, usages: list[Usage]) -> Usage:
    """Generated tokens summed over every choice; each prompt (and its cache hit) counted
    once, as OpenAI counts a batch of prompts."""
    total = choices.combined_usage(usages)
    heads = [g.usage for g in run.gens[::run.request.n]]  # one choice per prompt
    total.prompt_tokens = sum(u.prompt_tokens for u in heads)
    total.cached_tokens = sum(u.cached_tokens for u in heads)
    return total


class CompletionFrames(choices.ChoiceFrames):
    def __init__(self, run: Run, model_id: str, index: int = 0, n: int = 1,
                 echo: str | None = None) -> None:
        super().__init__(index, n)
        self.head = {"id": run.id, "object": "text_completion", "created": run.created,
                     "model": model_id}
        self.pending: list[dict[str, Any]] = []  # log-prob entries not sent yet (see ChatFrames)
        self.offset = 0  # text_offset of the next entry
        self.echo = echo  # the prompt's text, sent first (None: no echo)
        # the engine scores an echoed prompt when log-probs are asked for (engine/prepare.py)
        self.scored = run.request.sampling.wants_logprobs

    def chunk(self, text: str, finish: str | None = None, **extra: object) -> bytes:
        logprobs: dict[str, Any] | None = None
        if self.pending:
            logprobs, self.offset = legacy_block(self.pending, self.offset)
            self.pending = []
        return sse_data({**self.head, "choices": [{"index": self.index, "text": text,
                                                   "finish_reason": finish,
                                                   "logprobs": logprobs}], **extra})

    def opening(self) -> list[bytes]:
        """An echo without scoring sends the prompt at once; a scored one with its
        log-probs, once the prefill has read it."""
        return [self.chunk(self.echo)] if self.echo is not None and not self.scored else []

    def event(self, ev: Event) -> list[bytes]:
        if isinstance(ev, PromptLogprobs):
            if self.echo is None:
                return []
            self.offset = len(self.echo)
            return [sse_data({**self.head, "choices": [{
                "index": self.index, "text": self.echo, "finish_reason": None,
                "logprobs": echo_block(ev.entries, [], self.echo)}]})]
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


def choice_answer(index: int, reply: Reply, echo: str | None) -> dict[str, Any]:
    """One choice of a whole (non-streamed) answer."""
    fin = reply.finish
    choice: dict[str, Any] = {"index": index, "text": (echo or "") + reply.content,
                              "finish_reason": fin.reason}
    if fin.prompt_logprobs is not None and echo is not None:
        choice["logprobs"] = echo_block(fin.prompt_logprobs, fin.logprobs or [], echo)
    elif fin.logprobs is not None:
        choice["logprobs"] = legacy_block(fin.logprobs, len(echo or ""))[0]
    return choice


def register(app: App, engine: Engine) -> None:
    model_id = engine.model.id
    tokenizer = engine.model.tokenizer

    def answer(run: Run, replies: list[Reply], usage: Usage) -> dict[str, Any]:
        out = [choice_answer(i, reply, echo)
               for i, (reply, echo) in enumerate(zip(replies, echoes(run, tokenizer)))]
        return {"id": run.id, "object": "text_completion", "created": run.created,
                "model": model_id, "choices": out, "usage": usage.openai()}

    @guarded()
    async def completions(request: Request) -> Response:
        run = await generation.start(request, engine, route="/v1/completions", id_prefix="cmpl-",
                                     parse=engine.parse_completion)
        texts = echoes(run, tokenizer)
        return await choices.respond(
            request, run, lambda r, i, n: CompletionFrames(r, model_id, i, n, texts[i]), answer,
            lambda usages: request_usage(run, usages))

    app.router.add_post("/v1/completions", completions)
