"""A served model's own settings from ``mlxbun.yaml``'s ``models:``, put on its engine.

Order, highest first: the request's field, a ``serve`` flag or ``MLXBUN_*`` variable, the
model's entry, the file's ``serve:`` section, the checkpoint's ``generation_config.json``.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine.core import Engine

log = logging.getLogger("mlxbun.config")


def context_length(args: argparse.Namespace, model_id: str) -> int | None:
    """The window to serve ``model_id`` with: ``--context-length`` (or its variable), else
    the model's ``context_length`` entry, else the file's ``serve:`` value, else the
    embedded default's own (it needs 32k for a coding agent's prompt); None: the
    checkpoint's trained window. Needed before the load, unlike the settings below."""
    from ..models.paths import DEFAULT_CONTEXT_LENGTH, DEFAULT_MODEL_ID
    from .effective import Settings

    asked: int | None = getattr(args, "context_length", None)
    settings = getattr(args, "settings", None)
    if isinstance(settings, Settings):
        typed = settings.sources.get("context_length", "default").split(" ")[0]
        entry = settings.model(model_id)
        if typed not in ("flag", "env") and entry is not None \
                and entry.context_length is not None:
            asked = entry.context_length
    if asked is None and model_id == DEFAULT_MODEL_ID:
        asked = DEFAULT_CONTEXT_LENGTH
    return asked


def apply_model_settings(engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    """Put the served model's ``models:`` entry on ``engine``; returns what was applied."""
    from .effective import Settings

    settings = getattr(args, "settings", None)
    if not isinstance(settings, Settings):
        return {}
    entry = settings.model(engine.model.id)
    if entry is None:
        return {}

    def typed(key: str) -> bool:  # a flag or variable names this value: it wins
        return settings.sources.get(key, "default").split(" ")[0] in ("flag", "env")

    applied: dict[str, Any] = {k: v for k, v in entry.sampling.items() if not typed(k)}
    engine.defaults = {**engine.defaults, **applied}
    if entry.max_tokens is not None and not typed("max_tokens"):
        engine.max_tokens = applied["max_tokens"] = entry.max_tokens or None  # 0: no cap
    if entry.template_kwargs:
        engine.template_defaults = dict(entry.template_kwargs)
        applied["chat_template_kwargs"] = engine.template_defaults
    if applied:
        log.info("config: %s gets %s (models.%s)", engine.model.id, applied, entry.key)
    return applied
