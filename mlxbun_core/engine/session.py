"""One request's generation: tokens in, protocol-neutral events out.

Runs on the worker thread next to the forward pass, so the event loop only sees
finished text deltas. Surfaces (OpenAI, Anthropic, Responses) turn events into
their own wire format; nothing here knows about any protocol or family.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract import LogitsProcessor, Sampler, Tokenizer, ToolParser
from ..events import (
    Content,
    Done,
    Event,
    Finish,
    PromptLogprobs,
    Retry,
    TokenLogprob,
    ToolCallDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolCallWithdrawn,
    Usage,
)
from .cache_pins import Pin
from .logprobs import LogprobRecorder
from .sampling import SamplingParams
from .stages import Span, tracing
from .textstream import ReasoningSplitter, StopMatcher

if TYPE_CHECKING:
    import mlx.core as mx

    from ..grammar.base import GrammarProcessor
    from ..model import MediaPrompt

__all__ = ["GenerationRequest", "GenerationSession", "Usage", "Finish"]


@dataclass
class GenerationRequest:
    prompt_tokens: list[int]
    sampling: SamplingParams
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    think_start: str | None = None
    think_end: str | None = None
    in_reasoning: bool = False
    tool_parser: ToolParser | None = None
    input_embeddings: mx.array | None = None
    media: MediaPrompt | None = None  # its run() replaces the text decode loop
    # the grammar processor (also in sampling.extra_processors); .done ends the reply
    grammar: GrammarProcessor | None = None
    sampler: Sampler | None = None  # built when the request is prepared, so a bad value is a 400
    processors: list[LogitsProcessor] = field(default_factory=list)
    # score the prompt's own tokens during its prefill (engine/prompt_scoring.py)
    score_prompt: bool = False
    # prompt prefixes to pin in the prefix cache (cache_control, prompt_cache_key)
    cache_pins: list[Pin] = field(default_factory=list)


class GenerationSession:
    """Turns sampled tokens into events (:mod:`mlxbun_core.events`).

    Lanes feed it one token at a time (``step``) and close it (``finish``); it
    never touches the model, so serial and batched lanes share it unchanged.
    """

    def __init__(self, req: GenerationRequest, tokenizer: Tokenizer, limit: int | None):
        self.req = req
        self.tokenizer = tokenizer
        self.limit = limit  # effective max completion tokens (None = until EOS)
        self.detok = tokenizer.detokenizer
        self.eos = set(tokenizer.eos_token_ids)
        self.stopper = StopMatcher(req.stop)
        self.splitter = ReasoningSplitter(req.think_start, req.think_end, req.in_reasoning)
        self.parser = req.tool_parser
        if req.grammar is not None and hasattr(req.grammar, "set_budget"):
            req.grammar.set_budget(limit)  # close the constrained reply within the limit
        self.usage = Usage(prompt_tokens=len(req.prompt_tokens))
        self.logprobs: list[dict[str, Any]] | None = None
        self.prompt_logprobs: list[dict[str, Any]] | None = None
        if req.sampling.wants_logprobs:
            self.logprobs = []
            self.recorder = LogprobRecorder(tokenizer, req.sampling.top_logprobs)
        self.saw_tool_call = False
        self.streaming_calls: set[str] = set()  # ids of calls whose start went out
        self.finished: Finish | None = None
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        # seconds per phase, filled by the lane (admission_wait_s, ...)
        self.phases: dict[str, float] = {}
        # a traced request's lane phases on the perf_counter clock (stages.py; None: untraced)
        self.spans: list[Span] | None = [] if tracing() else None
        # called with the Finish once it ends (metrics)
        self.on_finish: Callable[[Finish], None] | None = None

    def span(self, phase: str, start: float, end: float | None = None,
             **attributes: Any) -> None:
        """Note a lane phase for the request's trace (nothing when it is not traced)."""
        if self.spans is not None:
            self.spans.append((phase, start, time.perf_counter() if end is None else end,
                               attributes))

    def spanned(self, spans: list[Span]) -> None:
        if self.spans is not None:
            self.spans.extend(spans)

    # -- token side -------------------------------------------------------
    def step(self, token: int, logprobs: mx.array | None) -> list[Event]:
        """Consume one sampled (or fill-forced: no ``logprobs``) token; return the
        events it produced."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.usage.completion_tokens += 1
        if self.splitter.inside:
            self.usage.reasoning_tokens += 1
        events = (self._record_logprobs(token, logprobs)
                  if self.logprobs is not None and logprobs is not None else [])
        if token in self.eos:
            return events + self.finish("stop")
        self.detok.add_token(token)
        events += self._text(self.detok.last_segment)
        if self.stopper.stopped is not None or getattr(self.parser, "done", False):
            return events + self.finish("stop")
        if self.limit is not None and self.usage.completion_tokens >= self.limit:
            return events + self.finish("length")
        return events

    def _record_logprobs(self, token: int, logprobs: mx.array) -> list[Event]:
        """The sampled token's entry, kept for the whole reply and streamed as an event."""
        entry = self.recorder.entry(token, logprobs)
        assert self.logprobs is not None  # only called when the request asked for them
        self.logprobs.append(entry)
        return [TokenLogprob(entry)]

    def scored(self, entries: list[dict[str, Any]]) -> list[Event]:
        """The prompt's own entries, scored by its prefill (kept for the whole reply)."""
        self.prompt_logprobs = entries
        return [PromptLogprobs(entries)]

    # -- text side --------------------------------------------------------
    def _text(self, segment: str) -> list[Event]:
        if not segment:
            return []
        return self._route(self.splitter.feed(self.stopper.feed(segment)))

    def _route(self, parts: list[Event]) -> list[Event]:
        if self.parser is None:
            return parts
        events: list[Event] = []
        for ev in parts:
            if isinstance(ev, Content):
                events += self._kept(self.parser.feed(ev.text))
            else:
                events.append(ev)
        return events

    def _kept(self, parsed: Iterable[Event]) -> list[Event]:
        """Notes calls; drops one the budget closed (its arguments were cut short to
        the shortest valid values: not what the model meant, so never run): a call
        that had started streaming is withdrawn, and no piece written under the
        budget's close goes out."""
        out: list[Event] = []
        for ev in parsed:
            if isinstance(ev, (ToolCallStart, ToolCallDelta)):
                if self._budget_forced():
                    continue
                if isinstance(ev, ToolCallStart):
                    self.streaming_calls.add(ev.call_id)
            elif isinstance(ev, ToolCallWithdrawn):
                if ev.call_id not in self.streaming_calls:
                    continue
            elif isinstance(ev, ToolCallEvent):
                if self._budget_forced():
                    if ev.call.id in self.streaming_calls:
                        out.append(ToolCallWithdrawn(ev.call.id))
                    continue
                self.saw_tool_call = True
            out.append(ev)
        return out

    def _budget_forced(self) -> bool:
        """Whether the grammar's budget close has forced a token up to now."""
        forced = getattr(self.req.grammar, "forced_from", None)
        return forced is not None and forced < self.usage.completion_tokens

    def finish(self, reason: str, error: str | None = None,
               retry: Retry | None = None) -> list[Event]:
        """Flush held-back text and close; idempotent (``retry``: a failure worth sending
        again later, see :class:`~mlxbun_core.events.Retry`)."""
        if self.finished is not None:
            return []
        events: list[Event] = []
        if reason == "stop" and self._budget_forced():
            reason = "length"  # the budget, not the model, ended it (closed by the grammar)
        if reason in ("stop", "length"):
            self.detok.finalize()
            tail = self.detok.last_segment
            if self.stopper.stopped is None:
                tail = self.stopper.feed(tail)
                tail += "" if self.stopper.stopped else self.stopper.flush()
            else:
                tail = ""
            events = self._route(self.splitter.feed(tail) + self.splitter.flush())
            if self.parser is not None:  # markup the budget or a stop string cut is dropped
                cut = reason == "length" or self.stopper.stopped is not None
                events += self._kept(self.parser.finish(cut=cut))
            if self.saw_tool_call and reason == "stop":
                reason = "tool_calls"
        now = time.perf_counter()
        timings = {"total_s": now - self.t0, **self.phases}
        if self.t_first is not None:
            timings["ttft_s"] = self.t_first - self.t0
            n = self.usage.completion_tokens
            if n > 1:
                timings["decode_tps"] = (n - 1) / max(now - self.t_first, 1e-9)
        self.finished = Finish(reason, self.usage, self.logprobs, self.stopper.stopped, error,
                               timings, retry, self.prompt_logprobs, list(self.spans or ()))
        if self.on_finish is not None:
            self.on_finish(self.finished)
        events.append(Done(self.finished))
        return events
