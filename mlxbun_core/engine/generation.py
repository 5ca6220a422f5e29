"""A started generation as a surface sees it: its events, its usage, how to stop it.

:meth:`Engine.start <mlxbun_core.engine.core.Engine.start>` hands one out; a surface never
sees the job, the lane or the worker behind it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from ..events import Done, Event, Finish, Usage
from .job import GenerationJob


class Generation:
    """A started request, as its surface sees it (``ended``: told its ``Finish`` once a
    surface has read it to the end)."""

    def __init__(self, job: GenerationJob, warning: str | None,
                 ended: Callable[[Finish], None]):
        self._job, self._ended = job, ended
        self.warning = warning
        self.prompt_tokens = len(job.request.prompt_tokens)

    @property
    def cache_note(self) -> str | None:
        """The ``X-Mlxbun-Cache`` header's value (None until a lane admitted it)."""
        return self._job.cache_note

    @property
    def usage(self) -> Usage:
        """Live token accounting (final once ``finish`` is set)."""
        return self._job.session.usage

    @property
    def finish(self) -> Finish | None:
        return self._job.session.finished

    def cancel(self) -> None:
        self._job.cancel()

    async def started(self) -> Finish | None:
        """Wait until a lane takes the request (the events read meanwhile are kept for ``events``);
        its ``Finish`` if it ended before that (refused for memory, the engine lost)."""
        head = await self._job.sink.read_ahead()
        return next((ev.finish for ev in head if isinstance(ev, Done)), None)

    async def events(self, keepalive: float | None = None) -> AsyncIterator[Event]:
        """The generation's events, ending with ``Done``; leaving early cancels it.
        ``keepalive``: a KeepAlive whenever none came for that many seconds."""
        try:
            while True:
                for ev in await self._job.sink.get(keepalive):
                    yield ev
                    if isinstance(ev, Done):
                        self._ended(ev.finish)
                        return
        finally:
            self._job.cancel()
