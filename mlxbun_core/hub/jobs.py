"""Hub work as jobs: downloads, pushes and dataset builds, in their own queue.

They share the job store (``GET /api/jobs`` and the SSE stream list them with the
rest) but not the queue: a download must not wait behind an hour of fine-tuning.
One hub job runs at a time. ``GET /downloads`` is built here from the store and the
live progress files the download jobs write.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import APIError, NotFound
from ..jobs.runner import Jobs
from ..jobs.store import TERMINAL, JobStore
from . import download

RECENT_DOWNLOADS = 5
# the hub's job kinds, run by the job manager's child process
RUNNERS = {"download": "mlxbun_core.hub.download:run", "push": "mlxbun_core.hub.push:run",
           "dataset": "mlxbun_core.hub.datasets:run"}


class Conflict(APIError):
    status = 409
    type = "conflict_error"


class HubJobs(Jobs):
    """The hub's job manager, made on first use (no ``jobs.sqlite`` before)."""

    runners = RUNNERS

    def __init__(self, home: Path):
        super().__init__(home)
        self._submit = threading.Lock()  # two clicks on Download: one job

    def active_download(self, repo: str) -> dict[str, Any] | None:
        for row in self.store.list(50, "download"):
            if row["status"] not in TERMINAL and json.loads(row["config_json"])["repo"] == repo:
                return row
        return None

    def submit_download(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Queue a download; :class:`Conflict` (409) while that repo is downloading."""
        config = download.prepare(body)
        with self._submit:
            if self.active_download(config["repo"]) is not None:
                raise Conflict(f"a download for {config['repo']} is already in progress")
            job_id = self.manager.submit("download", config)
        return job_id, config

    def dismiss_download(self, job_id: str) -> None:
        """Take a finished download (done, failed or cancelled) off ``GET /downloads`` for
        good: its job row goes, and its log file. :class:`NotFound` for no such download,
        :class:`Conflict` while it runs."""
        row = self.store.get(job_id)
        if row is None or row["kind"] != "download":
            raise NotFound(f"no download {job_id}")
        if row["status"] not in TERMINAL:
            raise Conflict(f"download {job_id} is still running: cancel it first")
        if not self.store.delete(job_id):  # dismissed by another client meanwhile
            raise NotFound(f"no download {job_id}")
        if row["log_path"]:
            Path(row["log_path"]).unlink(missing_ok=True)

    def downloads(self, limit: int = RECENT_DOWNLOADS) -> list[dict[str, Any]]:
        """``GET /downloads``: the newest downloads, active ones with live progress."""
        return [download_row(row, self.home) for row in self.store.list(limit, "download")]


def download_row(row: dict[str, Any], home: Path) -> dict[str, Any]:
    repo = json.loads(row["config_json"])["repo"]
    state = {"done": "done", "failed": "error", "zombie": "error"}.get(row["status"], "active")
    out: dict[str, Any] = {"job_id": row["id"], "repo_id": repo, "state": state,
                           "status": row["status"], "current_file": None, "received_bytes": 0,
                           "total_bytes": 0, "files_done": 0, "files_total": 0,
                           "bytes_per_sec": 0, "started_at": _epoch(row["started_at"]),
                           "finished_at": _epoch(row["ended_at"])}
    if state == "active":
        try:
            live = json.loads(download.live_path(repo, home).read_text())
        except (OSError, ValueError):
            live = {}
        out.update({k: live[k] for k in ("current_file", "received_bytes", "total_bytes",
                                         "files_done", "files_total", "bytes_per_sec")
                    if k in live})
    elif state == "error":
        out["error"] = row["error"]
    else:  # the local path stays off this open route (as /library keeps it off)
        out["progress"] = 1.0
    return out


def _epoch(iso: str | None) -> int | None:
    if not iso:
        return None
    from datetime import datetime

    return int(datetime.fromisoformat(iso).timestamp())


@functools.lru_cache(maxsize=8)  # one provider per home: registering again is a no-op
def downloading_provider(home: Path) -> Callable[[], dict[str, dict[str, Any]]]:
    """A provider for :mod:`mlxbun_core.library.downloads`: the repos a download job of
    this home is fetching now, with their live progress. It reads the shared job store, so
    an ``--isolate`` parent sees the downloads its engine children run."""
    home = Path(home)
    store: list[JobStore] = []

    def provide() -> dict[str, dict[str, Any]]:
        if not store:
            if not (home / "jobs.sqlite").exists():
                return {}
            store.append(JobStore(home / "jobs.sqlite"))
        return {row["repo_id"]: row for row in
                (download_row(r, home) for r in store[0].list(RECENT_DOWNLOADS, "download"))
                if row["state"] == "active"}

    return provide
