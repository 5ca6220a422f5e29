"""A deadline on every call to the Hugging Face Hub.

``huggingface_hub`` sends most API calls (``model_info``, ``list_models``,
``list_repo_files``) with ``timeout=None``: a hub, proxy or captive portal that accepts
the connection and never answers keeps the caller waiting forever (``mlxbun download``
sat silent for minutes). :func:`install` gives ``huggingface_hub``'s shared HTTP client a
request hook that fills in :func:`seconds` wherever a call set no deadline; calls that
set their own keep it. Every module that talks to the hub calls it first.
"""

from __future__ import annotations

import threading

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
        from huggingface_hub import set_client_factory
        from huggingface_hub.utils._http import default_client_factory

        def client():  # huggingface_hub's own client (its headers, proxies), plus the hook
            made = default_client_factory()
            made.event_hooks["request"] = [*made.event_hooks["request"], _deadline]
            return made

        set_client_factory(client)
        _installed.set()
