"""The Model Hub over HTTP: /api/hub/local|search|download|serve|delete, GET /downloads,
DELETE /api/hub/downloads/<id> (dismiss a finished one) and POST /api/jobs/<id>/cancel.

Thin wrappers over :mod:`mlxbun_core.hub`; downloads run as jobs in the hub's own
queue (the web app's ``hub_jobs``). Everything under ``/api/`` is an admin route (the
guard: loopback clients only unless an API key is set). Errors are
``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..errors import APIError, BadRequest, NotFound
from ..hub import remote, serving
from ..hub.jobs import Conflict, downloading_provider
from ..hub.search import search
from ..library.downloads import add_provider
from ..library.fit import machine
from ..library.report import library_row
from ..models.paths import hf_cache_dir, mlxbun_home
from ..server.common import guarded, json_response, read_body, route_param
from . import state as webapp_state

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App


def ok_error(exc: APIError) -> Response:
    """The ``/api/*`` job routes' error shape."""
    return json_response({"ok": False, "error": exc.message}, exc.status)


def served_paths(engine: Engine) -> list[Path]:
    """Directories a deletion must never touch: the model being served."""
    path = getattr(getattr(engine, "model", None), "path", None)
    return [Path(path)] if path else []


def register(app: App, engine: Engine) -> None:
    hub_jobs, library = webapp_state.of(app).hub_jobs, app.state.library
    add_provider(downloading_provider(hub_jobs.home))  # /v1/models: "state": "downloading"

    @guarded(ok_error)
    async def local(request: Request) -> Response:
        entries = await library.aentries(request.query.get("refresh", ["0"])[0] == "1")
        m = await asyncio.to_thread(machine)
        rows = [library_row(e, m, engine.model.id) for e in entries]
        return json_response({"ok": True, "offline": remote.offline(), "models": rows})

    @guarded(ok_error)
    async def hub_search(request: Request) -> Response:
        q = (request.query.get("q") or [""])[0].strip()
        if not q:
            raise BadRequest("q required")
        if len(q) > 200:
            raise BadRequest("q is too long (200 characters at most)")
        try:
            limit = int((request.query.get("limit") or ["20"])[0])
        except ValueError:
            raise BadRequest("limit must be an integer") from None
        return json_response(await asyncio.to_thread(search, q, limit))

    @guarded(ok_error)
    async def download(request: Request) -> Response:
        body = await read_body(request)
        job_id, config = await asyncio.to_thread(hub_jobs.submit_download, body)
        return json_response({"ok": True, "repo": config["repo"], "started": True,
                              "job_id": job_id})

    @guarded(ok_error)
    async def downloads(request: Request) -> Response:
        rows = await asyncio.to_thread(hub_jobs.downloads)
        return json_response({"downloads": rows})

    @guarded(ok_error)
    async def dismiss(request: Request) -> Response:
        job_id = route_param(request, "job_id")
        await asyncio.to_thread(hub_jobs.dismiss_download, job_id)
        return json_response({"ok": True, "job_id": job_id, "dismissed": True})

    @guarded(ok_error)
    async def serve(request: Request) -> Response:
        body = await read_body(request)
        model = body.get("model")
        if not isinstance(model, str) or not model.strip():
            raise BadRequest("model required")
        if model in (engine.model.id, str(engine.model.path)):
            return json_response({"ok": True, "serving": True, "model": model})
        # one process serves one model: the honest answer is how to start the other one
        # (under --isolate with a pool the parent answers this route itself)
        return json_response({"ok": False, "restart_required": True,
                              "command": f"mlxbun serve {model}"})

    @guarded(ok_error)
    async def delete(request: Request) -> Response:
        body = await read_body(request)
        repo = body.get("repo") or body.get("model")
        if not isinstance(repo, str) or not repo:
            raise BadRequest("repo required")
        entries = await library.aentries(True)
        entry = next((e for e in entries if e.id == repo), None)
        if entry is None:
            raise NotFound(f"{repo} is not in the local library")
        where = await asyncio.to_thread(_deletable, entry.path, served_paths(engine))
        if hub_jobs.active_download(repo) is not None:
            raise Conflict(f"{repo} is downloading: cancel the download first")
        await asyncio.to_thread(shutil.rmtree, where)
        await library.aentries(True)
        return json_response({"ok": True, "deleted": repo})

    @guarded(ok_error)
    async def cancel(request: Request) -> Response:
        job_id = route_param(request, "job_id")
        if hub_jobs.manager.cancel(job_id) or webapp_state.of(app).jobs.manager.cancel(job_id):
            return json_response({"ok": True, "job_id": job_id, "cancelled": True})
        row = await asyncio.to_thread(hub_jobs.store.get, job_id)
        if row is None:
            raise NotFound("job not found")
        raise Conflict(f"job {job_id} is {row['status']}: nothing to cancel")

    r = app.router
    r.add_get("/api/hub/local", local)
    r.add_get("/api/hub/search", hub_search)
    r.add_post("/api/hub/download", download)
    r.add_post("/api/hub/serve", serve)
    r.add_post("/api/hub/delete", delete)
    r.add_get("/downloads", downloads)
    r.add_delete("/api/hub/downloads/{job_id}", dismiss)
    r.add_post("/api/jobs/{job_id}/cancel", cancel)

    records = []
    for path in served_paths(engine):  # so `mlxbun gc` in another shell spares it
        with contextlib.suppress(OSError):  # a read-only home: this process still knows
            records.append(serving.announce(path))

    async def on_stop(application: Any) -> None:
        hub_jobs.close()
        for record in records:
            serving.withdraw(record)

    app.on_stop += on_stop


def _deletable(path: Path, served: list[Path]) -> Path:
    """The directory deleting a local model removes: its whole hub repo folder, or its
    own folder under the mlxbun home; never the served model, never anything else."""
    real = path.resolve()
    if any(real == s.resolve() for s in served):
        raise Conflict("that model is being served: serve another one first")
    hub = hf_cache_dir().resolve()
    if real.is_relative_to(hub) and "snapshots" in real.parts:
        repo_dir = real.parents[1]
        if repo_dir.parent == hub and repo_dir.name.startswith("models--"):
            if any(s.resolve().is_relative_to(repo_dir) for s in served):
                raise Conflict("a revision of that model is being served")
            return repo_dir
    home = mlxbun_home().resolve()
    if real.parent.parent == home and real.parent.name in ("models", "converted"):
        return real
    raise BadRequest("only models in the HF cache or mlxbun's own folders can be deleted here")
