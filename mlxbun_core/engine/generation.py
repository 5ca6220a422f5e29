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
        self._head: list[Event] | None = None  # first events, read by ``started``

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
        """Wait until a lane takes the request (its first events, kept for ``events``);
        its ``Finish`` if it ended before that (refused for memory, the engine lost)."""
        if self._head is None:
            self._head = await self._job.sink.queue.get()
        return next((ev.finish for ev in self._head if isinstance(ev, Done)), None)

    async def events(self) -> AsyncIterator[Event]:
        """The generation's events, ending with ``Done``; leaving early cancels it."""
        try:
            while True:
                head, self._head = self._head, None
                for ev in head if head is not None else await self._job.sink.queue.get():
                    yield ev
                    if isinstance(ev, Done):
                        self._ended(ev.finish)
                        return
        finally:
            self._job.cancel()
