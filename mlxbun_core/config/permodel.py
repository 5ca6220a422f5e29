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
