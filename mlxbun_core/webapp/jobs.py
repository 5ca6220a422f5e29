"""Long work as jobs: /api/jobs (list, one, SSE stream), /api/finetune/*,
/api/quantize/*. Every route here is an admin route (the guard: loopback clients
only unless an API key is set). Errors are ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from blacksheep import Application, Request, Response
from blacksheep.contents import StreamedContent

from .. import fspaths
from ..adapters import merge as adapter_merge
from ..errors import APIError, BadRequest
from ..jobs import finetune, quantize
from ..jobs.store import TERMINAL, JobStore
from ..server.common import (
    as_api_error,
    guarded,
    json_response,
    read_body,
    route_param,
    sse_data,
    watch_disconnect,
)
from . import state as webapp_state

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App

POLL_S = 0.25


def _error(exc: APIError) -> Response:
    return json_response({"ok": False, "error": exc.message}, exc.status)


def register(app: App, engine: Engine) -> None:
    jobs = webapp_state.of(app).jobs  # no jobs.sqlite until a job route is used
    home = jobs.home

    @guarded(_error)
    async def list_jobs(request: Request) -> Response:
        try:
            limit = max(1, min(500, int(request.query.get("limit", ["50"])[0])))
        except ValueError:
            raise BadRequest("limit must be an integer") from None
        kind = request.query.get("kind", [None])[0]
        rows = await asyncio.to_thread(jobs.store.list, limit, kind)
        return json_response({"ok": True, "jobs": rows})

    @guarded(_error)
    async def one_job(request: Request) -> Response:
        row = await asyncio.to_thread(jobs.store.get, route_param(request, "job_id"))
        if row is None:
            return json_response({"ok": False, "error": "job not found"}, 404)
        return json_response({"ok": True, "job": row})

    async def stream(request: Request) -> Response:
        job_id = route_param(request, "job_id")
        gone = asyncio.Event()

        async def frames() -> AsyncIterator[bytes]:
            watcher = watch_disconnect(request, gone.set)
            try:
                yield b"retry: 1500\n\n"
                async for frame in _tail(jobs.store, job_id, gone):
                    yield frame
                yield b"event: end\ndata: {}\n\n"
            finally:
                watcher.cancel()

        resp = Response(200, None, StreamedContent(b"text/event-stream", frames))
        resp.add_header(b"Cache-Control", b"no-cache")
        return resp

    @guarded(_error)
    async def finetune_submit(request: Request) -> Response:
        body = await read_body(request)
        config = await asyncio.to_thread(finetune.prepare, body, finetune.default_output(home))
        job_id = jobs.manager.submit("finetune", config, output_path=config["adapter_path"])
        return json_response({"ok": True, "job_id": job_id, "adapter_path": config["adapter_path"]})

    @guarded(_error)
    async def inspect_dataset(request: Request) -> Response:
        body = await read_body(request)
        return json_response(await asyncio.to_thread(finetune.inspect_dataset, body.get("path")))

    @guarded(_error)
    async def merge(request: Request) -> Response:
        body = await read_body(request)
        if not body.get("adapter_a") or not body.get("adapter_b"):
            raise BadRequest("adapter_a and adapter_b required")
        a, b = (fspaths.existing_dir(body[k], k) for k in ("adapter_a", "adapter_b"))
        out = finetune.default_output(home, f"merged-{time.strftime('%Y%m%d-%H%M%S')}")
        stats = await asyncio.to_thread(adapter_merge.merge, a, b, out, body.get("scales"))
        return json_response({"ok": True, "merged_path": str(out), "stats": stats})

    @guarded(_error)
    async def export(request: Request) -> Response:
        body = await read_body(request)
        if not body.get("base_model") or not body.get("adapter_path"):
            raise BadRequest("base_model and adapter_path required")
        if not isinstance(body["base_model"], str):
            raise BadRequest("base_model must be a string")
        adapter = fspaths.existing_dir(body["adapter_path"], "adapter_path",
                                       needs=[["adapter_config.json"]])
        out = home / "exports" / f"export-{time.strftime('%Y%m%d-%H%M%S')}"
        manifest = await asyncio.to_thread(adapter_merge.export_manifest, body["base_model"],
                                           adapter, out, body.get("method"))
        return json_response({"ok": True, "export_path": str(out), "manifest": manifest})

    @guarded(_error)
    async def quantize_inspect(request: Request) -> Response:
        body = await read_body(request)
        return json_response(await asyncio.to_thread(quantize.inspect, body.get("model_id")))

    @guarded(_error)
    async def quantize_submit(request: Request) -> Response:
        body = await read_body(request)
        config = await asyncio.to_thread(quantize.prepare, body, home)
        job_id = jobs.manager.submit("quantize", config, output_path=config["output_dir"])
        return json_response({"ok": True, "job_id": job_id, "output_dir": config["output_dir"]})

    async def on_stop(application: Application) -> None:
        jobs.close()

    app.on_stop += on_stop
    r = app.router
    r.add_get("/api/jobs", list_jobs)
    r.add_get("/api/jobs/{job_id}", one_job)
    r.add_get("/api/jobs/{job_id}/stream", stream)
    r.add_post("/api/finetune/submit", finetune_submit)
    r.add_post("/api/finetune/inspect-dataset", inspect_dataset)
    r.add_post("/api/finetune/merge", merge)
    r.add_post("/api/finetune/export", export)
    r.add_post("/api/quantize/inspect", quantize_inspect)
    r.add_post("/api/quantize/submit", quantize_submit)


async def _tail(store: JobStore, job_id: str, gone: asyncio.Event) -> AsyncIterator[bytes]:
    """The job's events as SSE frames until it ends (or the client leaves)."""
    if await asyncio.to_thread(store.get, job_id) is None:
        yield sse_data({"type": "failed", "error": "job not found", "ts": time.time()})
        return
    seq = 0
    while not gone.is_set():
        try:
            # the status first: then no event is missed
            row = await asyncio.to_thread(store.get, job_id)
            events = await asyncio.to_thread(store.events, job_id, seq)
        except Exception as exc:
            yield sse_data({"type": "failed", "error": as_api_error(exc).message,
                            "ts": time.time()})
            return
        for seq, event in events:  # noqa: B007 (seq: where the next poll starts)
            yield sse_data(event)
        if row is None or row["status"] in TERMINAL:
            if row is not None and row["status"] == "zombie" and not any(
                    e.get("type") in ("done", "failed") for _, e in events):
                yield sse_data({"type": "failed", "error": row["error"], "ts": time.time()})
            return
        await asyncio.sleep(POLL_S)
