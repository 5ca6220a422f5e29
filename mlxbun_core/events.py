"""What a generation reports, as small typed records.

Tool-call parsers and the engine's text pipeline emit these; surfaces (OpenAI,
Anthropic, Responses, the web chat) turn them into their own wire format. Nothing
here knows a protocol, a lane or a model family, and nothing here imports the rest of
the package: :class:`ToolCall` lives here (re-exported by :mod:`mlxbun_core.toolcalls`)
so the records stand below everything that makes or reads them. Every record has a ``kind`` so a
surface can dispatch with ``match`` on the class or compare ``kind`` strings.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar


def new_call_id() -> str:
    """A fresh tool-call id in OpenAI's shape (``call_`` and 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    """One parsed tool call: the function's ``name``, its ``arguments`` as JSON object
    text, and an ``id`` the client echoes back with the result. Tool-call dialects make
    these (:func:`mlxbun_core.toolcalls.make_call`); every surface renders them."""

    name: str
    arguments: str  # JSON object text
    id: str = field(default_factory=new_call_id)

    @property
    def args(self) -> dict[str, Any]:
        args: dict[str, Any] = json.loads(self.arguments)
        return args


@dataclass(frozen=True, slots=True)
class Content:
    """Answer text, ready to show (stop sequences and tool markup already removed)."""

    text: str
    kind: ClassVar[str] = "content"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Text from the model's think channel."""

    text: str
    kind: ClassVar[str] = "reasoning"


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """One complete, parsed tool call."""

    call: ToolCall
    kind: ClassVar[str] = "tool_call"


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A call's function name is known and its arguments begin to stream: the
    :class:`ToolCallDelta` pieces that follow, joined, are exactly the finished
    call's ``arguments``. Ends with the :class:`ToolCallEvent` of the same ``call_id``
    (the whole call; nothing of its arguments left to send) or :class:`ToolCallWithdrawn`."""

    call_id: str
    name: str
    kind: ClassVar[str] = "tool_call_start"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """The next piece of a streaming call's arguments (JSON object text)."""

    call_id: str
    text: str
    kind: ClassVar[str] = "tool_call_delta"


@dataclass(frozen=True, slots=True)
class ToolCallWithdrawn:
    """A streaming call will not be made: the budget or a stop sequence cut it, or its
    finished markup did not parse (or repeated an earlier call). Clients drop it."""

    call_id: str
    kind: ClassVar[str] = "tool_call_withdrawn"


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The log-probabilities of one generated token (only when the request asked for
    them): ``entry`` is OpenAI's ``{token, logprob, bytes, top_logprobs}`` plus ``id``.
    Comes before the text that token produced (which may be held back for a while)."""

    entry: dict[str, Any]
    kind: ClassVar[str] = "logprob"


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """The prompt's own tokens scored by the prefill (a completion with ``echo`` and
    ``logprobs``): one entry per prompt token in :class:`TokenLogprob`'s shape, the
    first with ``logprob`` None (nothing precedes it). Comes before any generated token."""

    entries: list[dict[str, Any]]
    kind: ClassVar[str] = "prompt_logprobs"


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """Nothing to show yet (a long tool call is buffering): keep the connection warm."""

    kind: ClassVar[str] = "keepalive"


@dataclass(frozen=True, slots=True)
class Admitted:
    """The request left the queue for a lane; ``cached_tokens`` of its prompt come
    from the prefix cache. Comes before any text (surfaces that announce usage up
    front, such as Anthropic's ``message_start``, wait for it)."""

    cached_tokens: int
    lane: str
    kind: ClassVar[str] = "admitted"


@dataclass
class Usage:
    """Token accounting for one request, shared by every surface."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # where the request's cache breakpoints fall in its prompt (Anthropic cache_control)
    cache_breakpoints: tuple[int, ...] = ()
    reasoning_tokens: int = 0
    lane: str = "serial"
    # {drafted, accepted, targetCalls} with a draft mounted
    speculation: dict[str, Any] | None = None
    # forced-token fill counters (``usage.fill``) when the request ran with fill on
    fill: dict[str, Any] | None = None

    def openai(self) -> dict[str, Any]:
        out = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "total_tokens": self.prompt_tokens + self.completion_tokens,
               "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
               "lane": self.lane}
        if self.reasoning_tokens:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        if self.speculation is not None:
            out["speculation"] = dict(self.speculation)
        if self.fill is not None:
            out["fill"] = self.fill_report()
        return out

    def fill_report(self) -> dict[str, Any]:
        """``usage.fill``: the fill counters, ``decodeSteps`` being the tokens that were
        sampled (every completion token the engine did not append)."""
        fill = dict(self.fill or {})
        fill["decodeSteps"] = self.completion_tokens - fill.get("injected", 0)
        return fill


@dataclass(frozen=True)
class Retry:
    """Why a failed generation may be sent again, and when: the engine could not run it
    now (``code``: ``memory_pressure``, or ``device_fault`` while the engine restarts).
    A surface answers it as a 503 with ``Retry-After: after`` while nothing was sent."""

    after: int  # seconds
    code: str


@dataclass
class Finish:
    """How a generation ended."""

    reason: str  # "stop" | "length" | "tool_calls" | "cancelled" | "error"
    usage: Usage
    logprobs: list[dict[str, Any]] | None = None
    stop_sequence: str | None = None
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    retry: Retry | None = None  # an error that is worth sending again later
    prompt_logprobs: list[dict[str, Any]] | None = None  # see PromptLogprobs
    # a traced request's lane phases: (phase, start, end, attributes), perf_counter clock
    spans: list[tuple[str, float, float, dict[str, Any]]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.reason in ("error", "cancelled")


@dataclass(frozen=True, slots=True)
class Done:
    """The last event of every generation."""

    finish: Finish
    kind: ClassVar[str] = "done"


KEEPALIVE = KeepAlive()

CallStream = ToolCallStart | ToolCallDelta | ToolCallWithdrawn
"""A call streaming as it is written (before its :class:`ToolCallEvent`)."""

Event = (Admitted | Content | Reasoning | ToolCallEvent | CallStream | TokenLogprob
         | PromptLogprobs | KeepAlive | Done)
"""Anything a generation emits."""

ParserEvent = Content | ToolCallEvent | CallStream | KeepAlive
"""What a tool-call parser's ``feed`` / ``finish`` return."""
