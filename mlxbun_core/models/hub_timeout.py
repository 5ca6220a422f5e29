"""A deadline on every call to the Hugging Face Hub.

``huggingface_hub`` sends most API calls (``model_info``, ``list_models``,
``list_repo_files``) with ``timeout=None``: a hub, proxy or captive portal that accepts
the connection and never answers keeps the caller waiting forever (``mlxbun download``
sat silent for minutes). :func:`install` gives ``huggingface_hub``'s shared HTTP client
(through its public ``set_client_factory``) a request hook that fills in :func:`seconds`
wherever a call set no deadline; calls that set their own keep it. Every module that
talks to the hub calls it first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..runconfig import current

DEFAULT_S = 30.0
_installed = threading.Event()
_lock = threading.Lock()


def seconds() -> float:
    """``MLXBUN_HUB_TIMEOUT`` (seconds), else 30: how long the hub may stay silent."""
    return current().models.hub_timeout or DEFAULT_S


def _deadline(request) -> None:
    """A request hook: each of connect, read, write and pool gets the deadline unless the
    call gave it one."""
    limit = seconds()
    timeouts = dict(request.extensions.get("timeout") or {})
    for phase in ("connect", "read", "write", "pool"):
        if timeouts.get(phase) is None:
            timeouts[phase] = limit
    request.extensions = {**request.extensions, "timeout": timeouts}


def install() -> None:
    """Make every later ``huggingface_hub`` call carry the deadline (once per process)."""
    if _installed.is_set():
        return
    with _lock:
        if _installed.is_set():
            return
        from huggingface_hub import get_session, set_client_factory

        set_client_factory(_factory_like(get_session()))
        _installed.set()


def _factory_like(theirs: Any) -> Callable[[], Any]:
    """A client factory for clients made as ``theirs`` (the one ``huggingface_hub``'s own
    factory made: its event hooks, redirects, headers), plus the deadline hook. Read
    through the client's public settings, so nothing of the hub's private module is named;
    the factory is called again whenever the hub drops its shared client (after an SSL or
    connection error)."""
    hooks = {kind: list(funcs) for kind, funcs in theirs.event_hooks.items()}
    hooks["request"] = [*hooks.get("request", []), _deadline]
    settings = {"event_hooks": hooks, "follow_redirects": theirs.follow_redirects,
                "max_redirects": theirs.max_redirects, "timeout": theirs.timeout,
                "headers": theirs.headers, "trust_env": theirs.trust_env}
    kind = type(theirs)
    return lambda: kind(**settings)
