"""LoRA hot-swap: GET/POST /v1/adapters, GET /v1/adapters/available,
DELETE /v1/adapters/<id>. Admin routes (the guard keeps them to loopback clients
unless an API key is set); mounting runs on the model worker between decode steps."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..adapters import discover
from ..errors import BadRequest
from .common import guarded, json_response, read_body, route_param

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App


def register(app: App, engine: Engine) -> None:
    manager = engine.adapters

    @guarded()
    async def mounted(request: Request) -> Response:
        return json_response({"adapters": manager.rows(), "default": manager.default})

    @guarded()
    async def available(request: Request) -> Response:
        by_path = {str(m.info.path): m.id for m in manager.mounted.values()}
        rows: list[dict[str, Any]] = []
        for info in await asyncio.to_thread(discover.scan):
            rows.append({"id": info.path.name, **info.row(),
                         "mounted": str(info.path) in by_path,
                         "mounted_as": by_path.get(str(info.path)),
                         "compatible": manager.compatible(info)})
        return json_response({"adapters": rows})

    @guarded()
    async def mount(request: Request) -> Response:
        body = await read_body(request)
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise BadRequest("force must be a boolean", param="force")
        m = await manager.mount_async(body.get("id"), body.get("path"), force=force)
        return json_response({"id": m.id, "mounted_layers": len(m.parts), "rank": m.rank,
                              "scale": m.info.scale, "ram_bytes": m.ram_bytes,
                              "format": m.info.format, "path": str(m.info.path)})

    @guarded()
    async def unmount(request: Request) -> Response:
        adapter_id = route_param(request, "adapter_id")
        removed = await manager.unmount_async(adapter_id)
        return json_response({"id": adapter_id, "removed_layers": removed})

    app.router.add_get("/v1/adapters", mounted)
    app.router.add_post("/v1/adapters", mount)
    app.router.add_get("/v1/adapters/available", available)
    app.router.add_delete("/v1/adapters/{adapter_id}", unmount)
