"""What a job body says while it runs, and how it fails clearly.

A body (:mod:`.finetune`, :mod:`.quantize`) gets an :data:`Emit` and calls it with JSON
objects that carry a ``type`` (``stage``, ``metric``, ...); a :class:`JobError` it raises
becomes the job's ``failed`` message, word for word. The runner (:mod:`.runner`) starts
bodies and reads what they say, so it stands above them; they import only this.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Emit", "JobError"]

Emit = Callable[[dict], None]  # one event of the running job


class JobError(Exception):
    """A runner's clear failure (bad config, missing library): the ``failed`` message."""
