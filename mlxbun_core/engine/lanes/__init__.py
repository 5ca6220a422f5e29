"""Lanes run generation jobs on the worker thread, one step at a time.

The worker hands each job to the first lane that ``accepts`` it and calls
``step()`` on every lane with work, so calls (embeddings, mounting) and other
lanes interleave between decode steps. A lane never knows a protocol.
"""

from __future__ import annotations

from typing import Protocol

from ...events import Retry
from ..job import GenerationJob
from .pace import PrefillPacer


class Lane(Protocol):
    name: str
    pacer: PrefillPacer
    """Sizes its prefill chunks (the engine's one pacer; tests swap in a fixed one)."""

    def accepts(self, job: GenerationJob) -> bool:
        """Whether this lane can run ``job`` (asked in lane order)."""

    def add(self, job: GenerationJob) -> None:
        """Take ``job``; it waits inside the lane until the lane admits it."""

    def step(self) -> None:
        """Advance every running job by at most one token (or one prefill chunk)."""

    @property
    def active(self) -> int:
        """Jobs running (admitted)."""

    @property
    def waiting(self) -> int:
        """Jobs taken but not yet admitted."""

    def jobs(self) -> list[GenerationJob]:
        """Every job held, running or waiting, read without the worker thread (the
        distributed watchdog ends them when that thread is stuck in a collective)."""

    @property
    def exclusive(self) -> bool:
        """Whether other lanes must pause while this one steps (a seeded request is
        reproducible only if nothing else draws from the random state meanwhile)."""

    def close(self, error: str = "server shutting down", reason: str = "cancelled",
              retry: Retry | None = None) -> None:
        """End every job, running or waiting, with ``reason`` and ``error`` (``retry``:
        one the client may send again later) and free the caches (worker shutdown, or a
        step that failed outside any one job); the lane stays usable."""
