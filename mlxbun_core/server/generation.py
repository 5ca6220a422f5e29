"""The one start path every generation surface shares.

A surface supplies three things: how to parse its body into a typed request,
a :class:`FrameWriter` for streaming, and how to shape a whole reply. Body
reading, tracing, starting, disconnect handling, the stream loop and the
failure frames live here once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from blacksheep import Request, Response

from ..engine.cache_explain import HEADER as CACHE_HEADER
from ..engine.reply import Reply, failure, gather
from ..engine.request import GenerationInput, choice_requests
from ..events import Admitted, Done, Event, Finish, KeepAlive
from . import trace as tracing
from .common import KEEPALIVE, json_response, new_id, now, read_body, sse_response, watch_disconnect

if TYPE_CHECKING:
    from ..engine.core import Engine, Generation

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
KEEPALIVE_S = 10.0  # a stream with nothing to send (a long prompt being read) says so this often


@dataclass
class Run:
    """A request parsed, prepared and queued, with its trace running."""

    id: str
    created: int
    body: dict[str, Any]
    request: GenerationInput
    gen: Generation  # the first choice's
    trace: tracing.Tracer  # a trace.Trace, or its no-op stand-in when tracing is off
    started: float
    gens: list[Generation] = field(default_factory=list)  # one per choice (``n``)

    @property
    def headers(self) -> dict[str, str] | None:
        out = {"Warning": self.gen.warning} if self.gen.warning else {}
        if self.gen.cache_note is not None:  # (None: it ended before a lane took it)
            out[CACHE_HEADER] = self.gen.cache_note
        return out or None

    @property
    def stream(self) -> bool:
        return self.request.stream


async def start(request: Request, engine: Engine, *, route: str, id_prefix: str,
                parse: Callable[[dict[str, Any]], GenerationInput]) -> Run:
    """Read the body, ``parse`` it into a typed request and start it, tracing each phase.

    Every client mistake raises an APIError here, before a byte is sent.
    """
    rid = new_id(id_prefix)
    trace = tracing.begin(request, route, rid)
    t, stage = time.perf_counter(), "body_parse"
    try:
        body = await read_body(request)
        trace.span("request.body_parse", t)
        t, stage = time.perf_counter(), "prepare_completion"
        typed = parse(body)
        gens = await start_choices(engine, typed)
        trace.span("request.prompt_prepare", t, prompt_tokens=gens[0].prompt_tokens)
    except Exception as exc:
        trace.finish("error", stage=stage, error=str(exc))
        raise
    return Run(rid, now(), body, typed, gens[0], trace, time.perf_counter(), gens)


async def start_choices(engine: Engine, typed: GenerationInput) -> list[Generation]:
    """One started generation per choice; if one cannot start (a full queue), the
    others are cancelled and the error stands for the request."""
    gens: list[Generation] = []
    try:
        for req in choice_requests(typed):
            gens.append(await engine.start(req))
    except BaseException:
        for gen in gens:
            gen.cancel()
        raise
    return gens


class FrameWriter:
    """A surface's streaming wire format: events in, SSE frames (bytes) out."""

    def opening(self) -> list[bytes]:
        return []

    def event(self, ev: Event) -> list[bytes]:
        raise NotImplementedError

    def keepalive(self) -> list[bytes]:
        return [KEEPALIVE]

    def admitted(self, ev: Admitted) -> list[bytes]:
        """The lane took the request (the prompt-cache hit is known now)."""
        return []

    def done(self, finish: Finish) -> list[bytes]:
        raise NotImplementedError

    def failed(self, message: str) -> list[bytes]:
        """The in-stream error frame (the response is already 200)."""
        raise NotImplementedError

    def frames_of(self, ev: Event) -> list[bytes]:
        """The frames of one event: each kind to its method (a failed finish: the
        in-stream error)."""
        if isinstance(ev, Done):
            fin = ev.finish
            return self.failed(fin.error or "generation cancelled") if fin.failed \
                else self.done(fin)
        if isinstance(ev, KeepAlive):
            return self.keepalive()
        if isinstance(ev, Admitted):
            return self.admitted(ev)
        return self.event(ev)


async def frames(gen: Generation, writer: FrameWriter) -> AsyncIterator[bytes]:
    for frame in writer.opening():
        yield frame
    async for ev in gen.events(keepalive=KEEPALIVE_S):
        for frame in writer.frames_of(ev):
            yield frame


async def admitted(request: Request, run: Run) -> None:
    """A stream's status waits for a lane to take every choice: one refused before that
    (no memory for it within its wait, the engine restarting) is a 503 with
    ``Retry-After`` in the surface's shape, not a 200 stream that only says so."""
    gens = run.gens or [run.gen]

    def cancel() -> None:
        for g in gens:
            g.cancel()

    watcher = watch_disconnect(request, cancel)
    try:
        for g in gens:
            fin = await g.started()
            if fin is not None and fin.retry is not None:
                cancel()
                async for _ in g.events():  # (its Done: counted and logged as it ends)
                    pass
                run.trace.finish("error", stage="admission", error=fin.error or "")
                raise failure(fin)
    finally:
        watcher.cancel()


async def respond(request: Request, run: Run, writer: Callable[[Run], FrameWriter],
                  answer: Callable[[Run, Reply], dict[str, Any]]) -> Response:
    """Stream with ``writer(run)``, or gather the whole reply and shape it with ``answer``."""
    if run.stream:
        await admitted(request, run)
        out = tracing.traced(frames(run.gen, writer(run)), run.trace, run.gen, run.started)
        return sse_response(request, run.gen, out, run.headers)
    try:
        reply = gather(await collect(request, run.gen))
    finally:
        run.trace.complete(run.gen, run.started)
    return json_response(answer(run, reply), headers=run.headers)


class EventSource(Protocol[T_co]):
    """A generation, or the choices of one request: its events, and how to stop it."""

    def cancel(self) -> None: ...

    def events(self) -> AsyncIterator[T_co]: ...


async def collect(request: Request, gen: EventSource[T]) -> list[T]:
    """Gather a non-streaming generation's events, cancelling it if the client leaves."""
    watcher = watch_disconnect(request, gen.cancel)
    try:
        return [ev async for ev in gen.events()]
    finally:
        watcher.cancel()
