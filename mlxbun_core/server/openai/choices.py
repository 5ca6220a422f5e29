"""``n`` choices for one prompt on the OpenAI chat and completions surfaces.

Each choice is its own engine job (:func:`~mlxbun_core.engine.request.choice_requests`
makes the copies; :func:`.generation.start` starts them), so every lane runs them as
it runs any request: the batch lane decodes them side by side. A :class:`Choices`
handle merges their events, tagged with the choice index, and cancels them together.

Streaming follows OpenAI: every chunk names its choice in ``choices[0].index``, each
choice ends with its own ``finish_reason`` chunk, and with ``n > 1`` a last chunk with
no choices carries the usage: the prompt counted once, completion tokens summed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ...engine.reply import Reply, gather
from ...events import KEEPALIVE, Done, Event, Finish, Usage
from .. import generation
from .. import trace as tracing
from ..common import json_response, sse_response
from ..generation import FrameWriter, Run, admitted, collect

if TYPE_CHECKING:
    from ...engine.core import Generation


class Choices:
    """The generations of one request, seen as one: events tagged ``(index, event)``."""

    def __init__(self, gens: list[Generation]):
        self.gens = gens

    def cancel(self) -> None:
        for g in self.gens:
            g.cancel()

    @property
    def finish(self) -> Finish | None:  # the trace reports the first choice
        return self.gens[0].finish

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Every choice's events as they come (each choice's own order kept); leaving
        early cancels them all."""
        if len(self.gens) == 1:
            async for ev in self.gens[0].events(keepalive=generation.KEEPALIVE_S):
                yield 0, ev
            return
        queue: asyncio.Queue[tuple[int, Event | None]] = asyncio.Queue()

        async def pump(index: int, gen: Generation) -> None:
            try:
                async for ev in gen.events():
                    queue.put_nowait((index, ev))
            finally:
                queue.put_nowait((index, None))

        pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(self.gens)]
        try:
            live = len(pumps)
            while live:
                try:  # Queue.get is safe to cancel: nothing is lost on a timeout
                    index, got = await asyncio.wait_for(queue.get(), generation.KEEPALIVE_S)
                except asyncio.TimeoutError:
                    index, got = 0, KEEPALIVE
                if got is None:
                    live -= 1
                else:
                    yield index, got
        finally:
            for p in pumps:
                p.cancel()
            self.cancel()


def combined_usage(usages: list[Usage]) -> Usage:
    """One request's usage over its choices: the prompt (and its cache hit) counted once,
    as OpenAI counts it, generated tokens summed."""
    first = usages[0]
    total = replace(first, completion_tokens=sum(u.completion_tokens for u in usages),
                    reasoning_tokens=sum(u.reasoning_tokens for u in usages))
    specs = [u.speculation for u in usages if u.speculation]
    if specs:
        total.speculation = {k: sum(s.get(k, 0) for s in specs) for k in specs[0]}
    fills = [u.fill for u in usages if u.fill]
    if fills:
        total.fill = {k: (sum((f[k] for f in fills), []) if isinstance(v, list)
                          else sum(f[k] for f in fills)) for k, v in fills[0].items()}
    return total


class ChoiceFrames(FrameWriter):
    """A surface's stream writer for one choice; ``summary`` closes an n-choice stream."""

    def __init__(self, index: int = 0, n: int = 1):
        self.index, self.n = index, n

    def summary(self, usage: Usage) -> list[bytes]:
        raise NotImplementedError


Combine = Callable[[list[Usage]], Usage]


async def choice_frames(choices: Choices, writers: list[ChoiceFrames],
                        combine: Combine = combined_usage) -> AsyncIterator[bytes]:
    for w in writers:
        for frame in w.opening():
            yield frame
    usages: list[Usage] = []
    failed = False
    # read to the end even after a failure: each generation's Done must be consumed
    # for the engine to count it finished; one choice is read without the merging
    # layer (an async generator hop per event on the loop's thread)
    single = len(writers) == 1
    source: AsyncIterator[Any] = (
        choices.gens[0].events(keepalive=generation.KEEPALIVE_S) if single
        else choices.events())
    async for item in source:
        index, ev = (0, item) if single else item
        if failed:
            continue
        if isinstance(ev, Done):
            if ev.finish.failed:  # one failed choice ends the stream; the others are cancelled
                failed = True
                choices.cancel()
            else:
                usages.append(ev.finish.usage)
        for frame in writers[index].frames_of(ev):
            yield frame
    if len(writers) > 1 and len(usages) == len(writers):
        for frame in writers[0].summary(combine(usages)):
            yield frame


async def respond(request: Request, run: Run, writer: Callable[[Run, int, int], ChoiceFrames],
                  answer: Callable[[Run, list[Reply], Usage], dict[str, Any]],
                  combine: Combine = combined_usage) -> Response:
    """Stream every choice through ``writer(run, index, n)``, or gather each choice's
    reply and shape them all with ``answer(run, replies, usage)``; ``combine`` folds the
    choices' usages into the request's (several prompts count each prompt once)."""
    choices, n = Choices(run.gens), len(run.gens)
    if run.stream:
        await admitted(request, run)
        frames = choice_frames(choices, [writer(run, i, n) for i in range(n)], combine)
        out = tracing.traced(frames, run.trace, choices, run.started)
        return sse_response(request, choices, out, run.headers)
    try:
        tagged = await collect(request, choices)
    finally:
        run.trace.complete(choices, run.started)
    replies = [gather([ev for i, ev in tagged if i == k]) for k in range(n)]
    usage = combine([r.finish.usage for r in replies])
    return json_response(answer(run, replies, usage), headers=run.headers)
