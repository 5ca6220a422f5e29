"""GET /library and GET /fit: the local models and what fits this machine.

Both read configs and safetensors headers only. ``/library`` reuses a scan for
30 seconds (``?refresh=1`` rescans); ``/v1/models`` lists the same scan after the
served model.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..errors import BadRequest
from ..library import checkpoint
from ..library.cache import local_rows
from ..library.fit import machine
from ..library.report import fit_report, library_row
from .common import guarded, json_response
from .model_report import with_family_blocks

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App


async def model_rows(app: App, served_id: str, created: int) -> list[dict[str, Any]]:
    """The local rows of ``/v1/models`` (supported models other than ``served_id``)."""
    return local_rows(await app.state.library.aentries(), served_id, created)


def _int_param(request: Request, name: str) -> int | None:
    raw = request.query.get(name, [None])[0]
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer", param=name) from None
    if value < 1:
        raise BadRequest(f"{name} must be at least 1", param=name)
    return value


def register(app: App, engine: Engine) -> None:
    cache = app.state.library
    weights: dict[str, Any] = {}  # the served checkpoint's header facts never change while serving

    @guarded()
    async def get_library(request: Request) -> Response:
        refresh = request.query.get("refresh", ["0"])[0] not in ("0", "", "false")
        entries = await cache.aentries(refresh)
        m = await asyncio.to_thread(machine)
        return json_response({"models": [library_row(e, m, engine.model.id) for e in entries]})

    @guarded()
    async def get_fit(request: Request) -> Response:
        ctx = _int_param(request, "ctx")
        if "w" not in weights:
            weights["w"] = await asyncio.to_thread(checkpoint.weights, engine.model.path)
        m = await asyncio.to_thread(machine)
        adm = getattr(engine, "admission", None)  # what this engine enforces, when it has one
        if adm is None:
            out = fit_report(engine.model.config, weights["w"], m, context=ctx)
        else:
            out = fit_report(engine.model.config, weights["w"], m, context=ctx,
                             budget_bytes=adm.budget_bytes, weights_bytes=adm.weights_bytes,
                             ceiling=adm.enforced_context, kv_bits=adm.kv_bits)
            out["report"]["memory_budget_bytes"] = (adm.budget_bytes if adm.budget_source
                                                    == "--memory-budget" else None)
        return json_response(await asyncio.to_thread(with_family_blocks, out, engine.model,
                                                     "fit"))

    app.router.add_get("/library", get_library)
    app.router.add_get("/fit", get_fit)
