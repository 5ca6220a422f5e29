"""Family blocks on ``/stats`` and ``/fit``: what the claiming plugin's ``model_report``
hook adds about its model (the core never knows which family that is)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..model import LoadedModel

log = logging.getLogger("mlxbun.server")


def with_family_blocks(body: dict[str, Any], model: LoadedModel,
                       section: str) -> dict[str, Any]:
    """``body`` with the blocks the model's family reports for ``section`` merged in;
    a block that would replace one of the route's own keys is dropped, and a failing
    plugin costs its blocks, never the route."""
    try:
        blocks = model.hooks.model_report(model=model, section=section)
    except Exception:
        log.exception("model_report(%s) failed in plugin %s", section, model.plugin)
        return body
    if not isinstance(blocks, dict):
        return body
    return {**body, **{k: v for k, v in blocks.items() if k not in body}}
