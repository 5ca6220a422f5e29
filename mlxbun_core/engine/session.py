"""One request's generation: tokens in, protocol-neutral events out.

Runs on the worker thread next to the forward pass, so the event loop only sees
finished text deltas. Surfaces (OpenAI, Anthropic, Responses) turn events into
their own wire format; nothing here knows about any protocol or family.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..events import Content, Done, Finish, ToolCallEvent, Usage
from .sampling import SamplingParams
from .textstream import ReasoningSplitter, StopMatcher

__all__ = ["GenerationRequest", "GenerationSession", "Usage", "Finish"]


@dataclass
class GenerationRequest:
    prompt_tokens: list
    sampling: SamplingParams
    max_tokens: Optional[int] = None
    stop: list = field(default_factory=list)
    think_start: Optional[str] = None
    think_end: Optional[str] = None
    in_reasoning: bool = False
    tool_parser: Any = None  # StreamingToolParser or None
    input_embeddings: Any = None
    media: Any = None  # a MediaPrompt: its run() replaces the text decode loop
    grammar: Any = None  # a grammar processor (also in sampling.extra_processors); .done ends it
    sampler: Any = None  # built when the request is prepared, so a bad value is a 400
    processors: list = field(default_factory=list)


LOGPROB_FLOOR = -9999.0  # OpenAI's value for an impossible token; JSON has no -Infinity


def json_logprob(value: float) -> float:
    """A masked token (a grammar, an overflowing bias) has log-prob -inf or NaN: floor it."""
    return value if math.isfinite(value) else LOGPROB_FLOOR


class GenerationSession:
    """Turns sampled tokens into events (:mod:`mlxbun_core.events`).

    Lanes feed it one token at a time (``step``) and close it (``finish``); it
    never touches the model, so serial and batched lanes share it unchanged.
    """

    def __init__(self, req: GenerationRequest, tokenizer, limit: Optional[int]):
        self.req = req
        self.tokenizer = tokenizer
        self.limit = limit  # effective max completion tokens (None = until EOS)
        self.detok = tokenizer.detokenizer
        self.eos = set(tokenizer.eos_token_ids)
        self.stopper = StopMatcher(req.stop)
        self.splitter = ReasoningSplitter(req.think_start, req.think_end, req.in_reasoning)
        self.parser = req.tool_parser
        self.usage = Usage(prompt_tokens=len(req.prompt_tokens))
        self.logprobs: Optional[list] = [] if req.sampling.wants_logprobs else None
        self.saw_tool_call = False
        self.finished: Optional[Finish] = None
        self.t0 = time.perf_counter()
        self.t_first: Optional[float] = None
        self.phases: dict = {}  # seconds per phase, filled by the lane (admission_wait_s, ...)
        self.on_finish = None  # called with the Finish once it ends (metrics)

    # -- token side -------------------------------------------------------
    def step(self, token: int, logprobs) -> list:
        """Consume one sampled token; return the events it produced."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.usage.completion_tokens += 1
        if self.splitter.inside:
            self.usage.reasoning_tokens += 1
        if self.logprobs is not None:
            self._record_logprobs(token, logprobs)
        if token in self.eos:
            return self.finish("stop")
        self.detok.add_token(token)
        events = self._text(self.detok.last_segment)
        if self.stopper.stopped is not None or getattr(self.parser, "done", False):
            return events + self.finish("stop")
        if self.limit is not None and self.usage.completion_tokens >= self.limit:
            return events + self.finish("length")
        return events

    def _record_logprobs(self, token, logprobs):
        import mlx.core as mx

        k = self.req.sampling.top_logprobs
        entry = {"id": int(token), "logprob": json_logprob(logprobs[token].item())}
        if k > 0:
            top = mx.argpartition(-logprobs, kth=k - 1)[:k]
            vals = [json_logprob(v) for v in logprobs[top].tolist()]
            pairs = sorted(zip(top.tolist(), vals), key=lambda p: -p[1])
            names = self.tokenizer.convert_ids_to_tokens([p[0] for p in pairs])
            tops = [{"id": i, "token": n, "logprob": v} for (i, v), n in zip(pairs, names)]
            entry = dict(tops[0], top_logprobs=tops)
        self.logprobs.append(entry)

    # -- text side --------------------------------------------------------
    def _text(self, segment: str) -> list:
        if not segment:
            return []
        return self._route(self.splitter.feed(self.stopper.feed(segment)))

    def _route(self, parts) -> list:
        if self.parser is None:
            return parts
        events = []
        for ev in parts:
            if isinstance(ev, Content):
                for out in self.parser.feed(ev.text):
                    self._note(out)
                    events.append(out)
            else:
                events.append(ev)
        return events

    def _note(self, ev):
        if isinstance(ev, ToolCallEvent):
            self.saw_tool_call = True

    def finish(self, reason: str, error: Optional[str] = None) -> list:
        """Flush held-back text and close; idempotent."""
        if self.finished is not None:
            return []
        events = []
        if reason in ("stop", "length"):
            self.detok.finalize()
            tail = self.detok.last_segment
            if self.stopper.stopped is None:
                tail = self.stopper.feed(tail) + ("" if self.stopper.stopped else self.stopper.flush())
            else:
                tail = ""
            events = self._route(self.splitter.feed(tail) + self.splitter.flush())
            if self.parser is not None:
                for ev in self.parser.finish():
                    self._note(ev)
                    events.append(ev)
            if self.saw_tool_call and reason == "stop":
                reason = "tool_calls"
        now = time.perf_counter()
        timings = {"total_s": now - self.t0, **self.phases}
        if self.t_first is not None:
            timings["ttft_s"] = self.t_first - self.t0
            n = self.usage.completion_tokens
            if n > 1:
                timings["decode_tps"] = (n - 1) / max(now - self.t_first, 1e-9)
        self.finished = Finish(reason, self.usage, self.logprobs, self.stopper.stopped, error, timings)
        if self.on_finish is not None:
            self.on_finish(self.finished)
        events.append(Done(self.finished))
        return events
