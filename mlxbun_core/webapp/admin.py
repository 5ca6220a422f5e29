"""Disk GC, settings, dataset builds, pushes and resolve-folder: /api/gc/*,
/api/settings/*, /api/dataset/*, /api/{quantize,finetune,dataset}/push,
/api/{quantize,model}/resolve-folder.

Thin wrappers over :mod:`mlxbun_core.hub`; every route is an admin route (loopback
clients only unless an API key is set) and answers ``{"ok": false, "error"}`` on a
mistake. Builds and pushes are jobs in the hub's queue.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..errors import APIError, BadRequest
from ..hub import datasets, folders, gc, push, remote, settings
from ..hub.jobs import Conflict
from ..server.common import guarded, json_response, read_body
from . import state as webapp_state
from .hub import ok_error, served_paths

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App


def register(app: App, engine: Engine) -> None:
    hub_jobs = webapp_state.of(app).hub_jobs

    def busy() -> list[str]:
        import json

        return [json.loads(r["config_json"])["repo"] for r in hub_jobs.store.list(50, "download")
                if r["status"] in ("queued", "running")]

    @guarded(ok_error)
    async def gc_plan(request: Request) -> Response:
        force = request.query.get("force", [""])[0] in ("1", "true")
        out = await asyncio.to_thread(lambda: gc.plan(served_paths(engine), busy=busy(),
                                                      force=force))
        return json_response(out)

    @guarded(ok_error)
    async def gc_execute(request: Request) -> Response:
        body = await read_body(request)
        plan_id, only = body.get("plan_id"), body.get("items")
        if plan_id is None and body.get("yes") is not True:
            raise BadRequest("pass the plan_id of a plan you reviewed (or yes: true to "
                             "delete what a fresh plan shows)")
        if plan_id is not None and not isinstance(plan_id, str):
            raise BadRequest("plan_id must be a string")
        if only is not None and not (isinstance(only, list) and all(
                isinstance(i, str) for i in only)):
            raise BadRequest("items must be a list of item ids")
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise BadRequest("force must be a boolean")
        try:
            out = await asyncio.to_thread(lambda: gc.execute(
                served_paths(engine), plan_id=plan_id, only=only, busy=busy(), force=force))
        except gc.PlanChanged as exc:
            raise Conflict(str(exc)) from None
        await app.state.library.aentries(True)
        return json_response(out)

    @guarded(ok_error)
    async def token_get(request: Request) -> Response:
        return json_response(settings.token_state())

    @guarded(ok_error)
    async def token_post(request: Request) -> Response:
        body = await read_body(request)
        return json_response(await asyncio.to_thread(settings.save_token, body.get("token")))

    @guarded(ok_error)
    async def token_delete(request: Request) -> Response:
        return json_response(await asyncio.to_thread(settings.forget_token))

    @guarded(ok_error)
    async def approvals_get(request: Request) -> Response:
        return json_response({"ok": True, "alwaysAllow": settings.approvals()})

    @guarded(ok_error)
    async def approvals_delete(request: Request) -> Response:
        sent = (request.get_first_header(b"content-length") or b"0") != b"0" or (
            request.get_first_header(b"transfer-encoding") is not None)
        body = await read_body(request) if sent else {}
        tool = body.get("tool") or next(iter(request.query.get("tool") or []), None)
        return json_response({"ok": True, "alwaysAllow": settings.revoke(tool)})

    @guarded(ok_error)
    async def dataset_templates(request: Request) -> Response:
        return json_response(datasets.templates())

    @guarded(ok_error)
    async def dataset_submit(request: Request) -> Response:
        body = await read_body(request)
        sessions = webapp_state.of(app).sessions.root
        config = await asyncio.to_thread(datasets.prepare, body, None, sessions)
        job_id = hub_jobs.manager.submit("dataset", config, output_path=config["output_dir"])
        return json_response({"ok": True, "job_id": job_id, "output_dir": config["output_dir"]})

    def pusher(kind: str) -> Any:
        @guarded(ok_error)
        async def push_route(request: Request) -> Response:
            body = await read_body(request)
            output = None
            if body.get("job_id") is not None and not body.get("source_path"):
                store = webapp_state.of(app).jobs.store
                row = await asyncio.to_thread(store.get, str(body["job_id"]))
                if row is None:
                    raise BadRequest("job not found", param="job_id")
                if row["status"] != "done":
                    raise BadRequest(f"job {row['id']} is {row['status']}, not done",
                                     param="job_id")
                output = row["output_path"]
            config = await asyncio.to_thread(push.prepare, body, kind, output)
            job_id = hub_jobs.manager.submit("push", config, output_path=config["source_path"])
            prefix = "" if config["repo_type"] == "model" else "/datasets"
            return json_response({"ok": True, "job_id": job_id,
                                  "url": f"{remote.endpoint()}{prefix}/{config['repo_id']}"})

        return push_route

    @guarded(ok_error)
    async def resolve_folder(request: Request) -> Response:
        body = await read_body(request)
        return json_response(await asyncio.to_thread(folders.resolve_folder, body))

    r = app.router
    r.add_get("/api/gc/plan", gc_plan)
    r.add_post("/api/gc/execute", gc_execute)
    r.add_get("/api/settings/hf-token", token_get)
    r.add_post("/api/settings/hf-token", token_post)
    r.add_delete("/api/settings/hf-token", token_delete)
    r.add_get("/api/settings/tool-approvals", approvals_get)
    r.add_delete("/api/settings/tool-approvals", approvals_delete)
    r.add_get("/api/dataset/templates", dataset_templates)
    r.add_post("/api/dataset/submit", dataset_submit)
    for kind in ("quantize", "finetune", "dataset"):
        r.add_post(f"/api/{kind}/push", pusher(kind))
    r.add_post("/api/quantize/resolve-folder", resolve_folder)
    r.add_post("/api/model/resolve-folder", resolve_folder)


__all__ = ["register", "APIError"]
