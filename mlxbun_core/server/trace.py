"""Prompt-to-response traces: one JSON record per request on stderr.

Off unless ``MLXBUN_P2R_TRACE=1``; then every generation surface (chat, completions,
messages, responses) records its phases and prints ``[p2r] {…}`` when the request ends.
The optional ``x-mlxbun-trace-id`` header names the record (the request id otherwise).
When off, every call lands on a shared no-op object: nothing is allocated per request.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from blacksheep import Request

from ..runconfig import current

if TYPE_CHECKING:
    from ..events import Finish


class Finishing(Protocol):
    """A generation (or the choices of one request): ``finish`` is set once it ends."""

    @property
    def finish(self) -> Finish | None: ...


class _Off:
    enabled = False

    def span(self, phase: str, start: float, end: float | None = None,
             **attributes: object) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass

    def finish(self, outcome: str, **attributes: object) -> None:
        pass

    def complete(self, gen: Finishing, started: float) -> None:
        pass


OFF = _Off()


class Trace:
    enabled = True

    def __init__(self, route: str, request_id: str, trace_id: str | None):
        self.route, self.request_id, self.trace_id = route, request_id, trace_id
        self.t0 = time.perf_counter()
        self.events: list[dict[str, Any]] = []
        self.done = False

    def _ms(self, t: float) -> float:
        return round((t - self.t0) * 1e3, 3)

    def span(self, phase: str, start: float, end: float | None = None,
             **attributes: object) -> None:
        end = time.perf_counter() if end is None else end
        ev: dict[str, Any] = {"phase": phase, "startMs": self._ms(start),
              "durationMs": round((end - start) * 1e3, 3)}
        if attributes:
            ev["attributes"] = attributes
        self.events.append(ev)

    def mark(self, phase: str) -> None:
        self.events.append({"phase": phase, "startMs": self._ms(time.perf_counter()),
                            "durationMs": 0})

    def complete(self, gen: Finishing, started: float) -> None:
        """Close the record from the generation's own timings (see Finish.timings)."""
        fin = gen.finish
        if fin is None:
            self.finish("abort")
            return
        t = fin.timings
        self.span("completion.total", started, started + t.get("total_s", 0.0),
                  lane=fin.usage.lane, completion_tokens=fin.usage.completion_tokens)
        at = started  # the lane's phases, in order, from the job's own clock
        attrs: Mapping[str, object]
        for phase, key, attrs in (
                ("engine.admission_wait", "admission_wait_s", {}),
                ("cache.lookup_restore", "cache_lookup_s",
                 {"cached_tokens": fin.usage.cached_tokens}),
                ("prefill.total", "prefill_s", {"prompt_tokens": fin.usage.prompt_tokens})):
            if key in t:
                self.span(phase, at, at + t[key], **attrs)
                at += t[key]
        if "ttft_s" in t:
            self.span("token_zero.total", started, started + t["ttft_s"],
                      prompt_tokens=fin.usage.prompt_tokens)
        for phase, start, end, attributes in fin.spans:  # the lane's own (engine/stages.py)
            self.span(phase, start, end, **attributes)
        self.mark("response.final_write")
        outcome = {"cancelled": "abort", "error": "error"}.get(fin.reason, "success")
        self.finish(outcome)

    def finish(self, outcome: str, **attributes: object) -> None:
        if self.done:
            return
        self.done = True
        record: dict[str, Any] = {"version": 1, "traceId": self.trace_id or self.request_id,
                  "requestId": self.request_id, "route": self.route, "clock": "monotonic-ms",
                  "outcome": outcome, "totalMs": self._ms(time.perf_counter()),
                  "events": sorted(self.events, key=lambda e: e["startMs"])}
        if attributes:
            record["attributes"] = attributes
        print("[p2r] " + json.dumps(record, separators=(",", ":")), file=sys.stderr, flush=True)


Tracer = Trace | _Off


def begin(request: Request, route: str, request_id: str) -> Tracer:
    """A Trace for this request, or the shared no-op when tracing is off."""
    if not current().server.p2r_trace:
        return OFF
    raw = request.get_first_header(b"x-mlxbun-trace-id")
    return Trace(route, request_id, raw.decode("latin-1") if raw else None)


def traced(frames: AsyncIterator[bytes], trace: Tracer, gen: Finishing,
           started: float) -> AsyncIterator[bytes]:
    """SSE frames passed through, marking the first write and closing the record;
    untraced, ``frames`` itself (a layer less for every frame of every stream)."""
    return _traced(frames, trace, gen, started) if trace.enabled else frames


async def _traced(frames: AsyncIterator[bytes], trace: Tracer, gen: Finishing,
                  started: float) -> AsyncIterator[bytes]:
    first = True
    try:
        async for frame in frames:
            yield frame
            if first:
                trace.mark("response.first_write")
                first = False
    finally:
        trace.complete(gen, started)
