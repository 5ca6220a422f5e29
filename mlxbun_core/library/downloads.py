"""Models being downloaded right now, for ``/v1/models``'s ``"state": "downloading"``.

A downloader either marks a model itself (:func:`set_downloading` as it starts, with any
progress fields it likes, :func:`clear_downloading` when it ends, failed or not) or
registers a provider (:func:`add_provider`): a callable answering ``{model id: progress}``
at listing time, for downloads it tracks elsewhere (a job store, another process).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("mlxbun.library")

Progress = dict[str, Any]
_lock = threading.Lock()
_active: dict[str, Progress] = {}
_providers: list[Callable[[], Mapping[str, Progress]]] = []


def set_downloading(model_id: str, progress: Progress | None = None) -> None:
    """``model_id`` is being downloaded (call again to update ``progress``)."""
    with _lock:
        _active[model_id] = dict(progress or {})


def clear_downloading(model_id: str) -> None:
    with _lock:
        _active.pop(model_id, None)


def add_provider(provider: Callable[[], Mapping[str, Progress]]) -> None:
    """``provider()`` is asked at every listing; it must be quick and must not block."""
    with _lock:
        if provider not in _providers:
            _providers.append(provider)


def remove_provider(provider: Callable[[], Mapping[str, Progress]]) -> None:
    with _lock:
        if provider in _providers:
            _providers.remove(provider)


def downloading() -> dict[str, Progress]:
    """Every model being downloaded now: ``{model id: progress}``."""
    with _lock:
        out = {k: dict(v) for k, v in _active.items()}
        providers = list(_providers)
    for provider in providers:
        try:
            out.update({k: dict(v) for k, v in provider().items()})
        except Exception:  # a provider's bug must not break /v1/models
            log.warning("download state provider %r failed", provider, exc_info=True)
    return out
