"""POST /v1/messages (+ /v1/messages/count_tokens) — the Anthropic Messages surface.

The body is parsed straight into the engine's typed chat request
(:mod:`.anthropic_request`, errors named as the client named the fields) and started
through :mod:`.generation`, the same path as /v1/chat/completions, so templates, tool
parsing, media checks and grammar are shared; only the wire format differs.

Reasoning is surfaced as Anthropic's extended-thinking shape: a ``thinking``
block (empty ``signature``; we sign nothing) before the text, present only when
the model actually thought (its text left out under ``thinking.display:
"omitted"``). Prior-turn thinking blocks are dropped on re-ingest. Tool-use ids
take Anthropic's ``toolu_`` shape.
``usage.input_tokens`` follows Anthropic's meaning. With ``cache_control`` breakpoints
(:mod:`.cache_control`): ``cache_read_input_tokens`` is the prompt up to the furthest
breakpoint the cache served, ``cache_creation_input_tokens`` from there to the last
breakpoint (written now), ``input_tokens`` the rest. Without: the prompt tokens NOT read
from the prefix cache, ``cache_read_input_tokens`` (present only when the cache
contributed) the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ...engine.request import ChatRequest
from ...errors import APIError
from ...events import (
    Admitted,
    Content,
    Event,
    Finish,
    Reasoning,
    ToolCall,
    ToolCallDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolCallWithdrawn,
    Usage,
)
from .. import generation
from ..common import guarded, json_response, read_body, sse_event
from .request import parse_request
from .system import thinking_omitted

if TYPE_CHECKING:
    from ...engine.core import Engine
    from ...engine.reply import Reply
    from ..generation import Run
    from ..state import App

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
TOO_LONG = re.compile(r"prompt has (\d+) tokens; this server admits at most (\d+) tokens of "
                      r"context(.*)$")


def anthropic_error(exc: APIError) -> Response:
    """Anthropic's error shape has no ``param``: a known one leads the message instead.
    A prompt over the context is said in Anthropic's words (``prompt is too long: N
    tokens > M maximum``), the form Claude Code parses for the token counts and answers
    with its compaction advice, then what sets the limit (the flag that changes it) in
    parentheses, as on the other surfaces (Claude Code's parse ignores what follows)."""
    fallback = "api_error" if exc.status >= 500 else "invalid_request_error"
    kind = ERROR_TYPES.get(exc.status, fallback)
    message = exc.message
    if exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"
    too_long = TOO_LONG.search(message) if exc.code == "context_over_budget" else None
    if too_long:
        message = (f"prompt is too long: {too_long[1]} tokens > {too_long[2]} maximum"
                   f"{too_long[3] or ''}")
    return json_response({"type": "error", "error": {"type": kind, "message": message}},
                         exc.status)


# ---------------------------------------------------------------- request side

def parser(engine: Engine, *,
           need_max_tokens: bool = True) -> Callable[[dict[str, Any]], ChatRequest]:
    """Anthropic body -> typed chat request, with the served model's defaults."""
    def parse(body: dict[str, Any]) -> ChatRequest:
        return parse_request(body, engine.defaults, engine.max_tokens,
                             need_max_tokens=need_max_tokens)
    return parse


# ---------------------------------------------------------------- response side

def cache_usage(usage: Usage) -> dict[str, int]:
    """The input token fields: by the breakpoints when the request set some, else by
    the prefix cache's hit. With breakpoints, the read is the hit up to the last one (a
    rolling breakpoint, new each turn, reads the previous turn's prefix, as Anthropic's
    lookback over earlier blocks does), and a breakpoint at the prompt's end counts as
    read when all but the last token hit (a hit always leaves one token to feed)."""
    prompt, hit, marks = usage.prompt_tokens, usage.cached_tokens, usage.cache_breakpoints
    if not marks:
        out = {"input_tokens": prompt - hit}
        return {**out, "cache_read_input_tokens": hit} if hit > 0 else out
    read = max(min(hit, marks[-1]),
               max((p for p in marks if hit >= min(p, prompt - 1)), default=0))
    return {"input_tokens": prompt - marks[-1], "cache_creation_input_tokens": marks[-1] - read,
            "cache_read_input_tokens": read}


def _usage(usage: Usage, *, output: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = cache_usage(usage)
    if output:
        out["output_tokens"] = usage.completion_tokens
        if usage.fill is not None:  # forced-token fill (MLXBUN_FILL=strict)
            out["fill"] = usage.fill_report()
        if usage.speculation is not None:  # our extension, as on the OpenAI surfaces
            out["speculation"] = dict(usage.speculation)
    return out


def _stop(finish: Finish) -> tuple[str, str | None]:
    if finish.stop_sequence:
        return "stop_sequence", finish.stop_sequence
    return STOP_REASONS.get(finish.reason, "end_turn"), None


def tool_use_id(call_id: str) -> str:
    """Anthropic's id shape (``toolu_…``) for an engine call id (``call_…``). The client
    sends it back on the tool_use and its tool_result alike, so it round-trips as is."""
    if call_id.startswith("toolu_"):
        return call_id
    return "toolu_" + call_id.removeprefix("call_")


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        args = {}
    return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
            "input": args if isinstance(args, dict) else {}}


class MessageFrames(generation.FrameWriter):
    """Anthropic's event grammar: message_start, content blocks, message_delta, message_stop.

    A tool call streams as a ``tool_use`` block (``content_block_start`` with its id and
    name, ``input_json_delta`` pieces, ``content_block_stop``). A streamed call that is
    withdrawn (the budget cut it) has its block stopped where it was; ``message_delta``
    says so: ``stop_reason`` ``max_tokens``, and its ``delta.withdrawn_tool_use_ids``."""

    def __init__(self, run: Run, model_id: str) -> None:
        self.run, self.model_id = run, model_id
        self.index = -1
        self.open_kind: str | None = None
        self.started = False
        self.omit_thinking = thinking_omitted(run.body)
        self.streaming: str | None = None  # the id of the call whose block is open
        self.withdrawn: list[str] = []

    def admitted(self, ev: Admitted) -> list[bytes]:
        # sent as the lane takes the request, before prefill (clients show progress from
        # it); the same accounting as message_delta, cache hit included
        if self.started:
            return []
        self.started = True
        usage = _usage(Usage(prompt_tokens=self.run.gen.prompt_tokens,
                             cached_tokens=ev.cached_tokens,
                             cache_breakpoints=self.run.gen.usage.cache_breakpoints),
                       output=False)
        return [sse_event("message_start", {"type": "message_start", "message": {
            "id": self.run.id, "type": "message", "role": "assistant", "model": self.model_id,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**usage, "output_tokens": 0}}})]

    def _start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        frames = self._stop()
        self.index += 1
        self.open_kind = kind
        frames.append(sse_event("content_block_start", {
            "type": "content_block_start", "index": self.index, "content_block": block}))
        return frames

    def _stop(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [sse_event("content_block_stop",
                          {"type": "content_block_stop", "index": self.index})]

    def _delta(self, d: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta",
                         {"type": "content_block_delta", "index": self.index, "delta": d})

    def _text(self, t: str) -> list[bytes]:
        opened = self.open_kind == "text"
        frames: list[bytes] = [] if opened else self._start("text", {"type": "text", "text": ""})
        return frames + [self._delta({"type": "text_delta", "text": t})]

    def event(self, ev: Event) -> list[bytes]:
        if isinstance(ev, Reasoning) and ev.text:
            frames: list[bytes] = [] if self.open_kind == "thinking" else self._start(
                "thinking", {"type": "thinking", "thinking": "", "signature": ""})
            if self.omit_thinking:  # the block says that the model thought, not what
                return frames
            return frames + [self._delta({"type": "thinking_delta", "thinking": ev.text})]
        if isinstance(ev, Content) and ev.text:
            return self._text(ev.text)  # the tool parser drops whitespace around a call
        if isinstance(ev, ToolCallEvent):
            call = ev.call
            if call.id == self.streaming:  # every piece went out: the block ends
                self.streaming = None
                return self._stop()
            frames = self._start("tool_use", {"type": "tool_use", "id": tool_use_id(call.id),
                                              "name": call.name, "input": {}})
            frames.append(self._delta({"type": "input_json_delta",
                                       "partial_json": call.arguments or "{}"}))
            return frames + self._stop()
        return self._call_stream(ev)

    def _call_stream(self, ev: Event) -> list[bytes]:
        if isinstance(ev, ToolCallStart):
            self.streaming = ev.call_id
            return self._start("tool_use", {"type": "tool_use", "id": tool_use_id(ev.call_id),
                                            "name": ev.name, "input": {}})
        if isinstance(ev, ToolCallDelta) and ev.call_id == self.streaming:
            return [self._delta({"type": "input_json_delta", "partial_json": ev.text})]
        if isinstance(ev, ToolCallWithdrawn) and ev.call_id == self.streaming:
            self.streaming = None
            self.withdrawn.append(tool_use_id(ev.call_id))
            return self._stop()
        return []

    def keepalive(self) -> list[bytes]:
        return [sse_event("ping", {"type": "ping"})]

    def done(self, finish: Finish) -> list[bytes]:
        frames = self.admitted(Admitted(finish.usage.cached_tokens, finish.usage.lane))
        frames += self._text("") if self.index < 0 else []
        frames += self._stop()
        reason, seq = _stop(finish)
        delta: dict[str, Any] = {"stop_reason": reason, "stop_sequence": seq}
        if self.withdrawn:
            delta["withdrawn_tool_use_ids"] = self.withdrawn
        frames.append(sse_event("message_delta", {
            "type": "message_delta", "delta": delta, "usage": _usage(finish.usage)}))
        frames.append(sse_event("message_stop", {"type": "message_stop"}))
        return frames

    def failed(self, message: str) -> list[bytes]:
        error = {"type": "error", "error": {"type": "api_error", "message": message}}
        return self.admitted(Admitted(0, "")) + [sse_event("error", error)]


def register(app: App, engine: Engine) -> None:
    model_id = engine.model.id

    def answer(run: Run, reply: Reply) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.reasoning:
            shown = "" if thinking_omitted(run.body) else reply.reasoning
            content.append({"type": "thinking", "thinking": shown, "signature": ""})
        if reply.content.strip() or (reply.content and not reply.tool_calls):
            content.append({"type": "text", "text": reply.content})
        content += [_tool_use(c) for c in reply.tool_calls]
        if not content:
            content.append({"type": "text", "text": ""})
        reason, seq = _stop(reply.finish)
        return {"id": run.id, "type": "message", "role": "assistant", "model": model_id,
                "content": content, "stop_reason": reason, "stop_sequence": seq,
                "usage": _usage(reply.finish.usage)}

    @guarded(anthropic_error)
    async def messages(request: Request) -> Response:
        run = await generation.start(request, engine, route="/v1/messages", id_prefix="msg_",
                                     parse=parser(engine))
        return await generation.respond(request, run, lambda r: MessageFrames(r, model_id), answer)

    count = parser(engine, need_max_tokens=False)

    @guarded(anthropic_error)
    async def count_tokens(request: Request) -> Response:
        body = await read_body(request)
        typed = count(body)  # a bad format is a 400 here too …
        n = await engine.count_prompt_tokens(typed)  # … but counting compiles no grammar
        return json_response({"input_tokens": n})

    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
