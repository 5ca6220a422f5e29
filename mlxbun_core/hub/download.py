"""Download a hub repo into the HF cache, as a job (``kind: "download"``).

:mod:`.transfer` fetches each file through ``huggingface_hub``'s HTTP layer: blobs land
as ``blobs/<etag>.incomplete``, are verified and renamed when whole, and a later attempt
resumes a partial blob with a Range request. Around it this job body adds what a
library needs:

- only what a model needs is fetched (weights, configs, tokenizer; one GGUF of a
  GGUF-only repo), one file at a time so progress names the file;
- the snapshot is marked pending (:mod:`.partial`) until every file is there and
  its size checked, so the library never lists half a model; a failure or a cancel
  (SIGTERM from the job manager) removes the snapshot's links and the ``refs`` entry
  it made, and keeps the blobs, so the next attempt resumes instead of starting over;
- progress goes to a small live file (for ``GET /downloads``: bytes, rate, current
  file) and, at most once a second and once per percent, a ``stage`` event (the job's
  SSE stream), so a multi-hour download stays inside the job's event cap.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..jobs.events import Emit, JobError
from ..library import partial
from ..models.paths import hf_cache_dir, mlxbun_home
from . import remote

PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py")
RESERVE_BYTES = 1 << 30  # left free on the volume after a download
EVENT_EVERY_S = 1.0
LIVE_EVERY_S = 0.25


def live_dir(home: Path | None = None) -> Path:
    return mlxbun_home(home) / "downloads" / "live"


def live_path(repo_id: str, home: Path | None = None) -> Path:
    return live_dir(home) / (repo_id.replace("/", "--") + ".json")


def prepare(body: dict[str, Any]) -> dict[str, Any]:
    """The job's config from a request body (``repo``, optional ``revision``)."""
    from ..errors import BadRequest

    repo = remote.check_repo_id(body.get("repo") or body.get("repo_id"), "repo")
    revision = body.get("revision") or "main"
    if not isinstance(revision, str) or not revision.strip() or len(revision) > 200 or (
            ".." in revision or revision.startswith("/")):
        raise BadRequest("revision must be a branch, tag or commit", param="revision")
    return {"repo": repo, "revision": revision.strip(), "cache_dir": str(hf_cache_dir())}


def wanted_files(files: list[str]) -> list[str]:
    """What a model needs of a repo's files: the patterns, else one GGUF."""
    from ..models.resolve import _pick_gguf

    if "config.json" in files:
        return [f for f in files if any(fnmatch.fnmatch(f, p) for p in PATTERNS)]
    gguf = _pick_gguf(files)
    if gguf is None:
        raise JobError("the repo has neither config.json nor a .gguf file: not a model "
                       "mlxbun can serve")
    return [gguf] + [f for f in files if f.endswith(".json") and "/" not in f]


class Progress:
    """Bytes across the files of one download; writes the live file and stage events."""

    def __init__(self, repo: str, sizes: dict[str, int], emit: Emit):
        self.repo, self.sizes, self.emit = repo, sizes, emit
        self.total = sum(sizes.values())
        self.done_bytes = 0  # files finished
        self.file_bytes = 0  # the current file so far
        self.files_done = 0
        self.current: str | None = None
        self.window: deque[tuple[float, int]] = deque()
        self.started = time.time()
        self._live_at = self._event_at = 0.0
        self._last_pct = -1
        self.path = live_path(repo)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def received(self) -> int:
        return self.done_bytes + self.file_bytes

    def start_file(self, name: str) -> None:
        self.current, self.file_bytes = name, 0
        self.report(force=True)

    def end_file(self) -> None:
        self.done_bytes += self.sizes.get(self.current or "", self.file_bytes)
        self.file_bytes, self.files_done = 0, self.files_done + 1
        self.report(force=True)

    def rate(self) -> float:
        now = time.monotonic()
        self.window.append((now, self.received))
        while len(self.window) > 2 and now - self.window[0][0] > 5.0:
            self.window.popleft()
        t0, b0 = self.window[0]
        return (self.received - b0) / (now - t0) if now > t0 else 0.0

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._live_at < LIVE_EVERY_S:
            return
        self._live_at = now
        state = {"repo_id": self.repo, "state": "active", "current_file": self.current,
                 "received_bytes": self.received, "total_bytes": self.total,
                 "files_done": self.files_done, "files_total": len(self.sizes),
                 "bytes_per_sec": round(self.rate()), "started_at": int(self.started),
                 "pid": os.getpid()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)
        pct = int(100 * self.received / self.total) if self.total else 0
        if force or (pct != self._last_pct and now - self._event_at >= EVENT_EVERY_S):
            self._event_at, self._last_pct = now, pct
            self.emit({"type": "stage", "stage": "download",
                       "progress": self.received / self.total if self.total else 0.0,
                       "message": f"{self.current or ''} ({self.files_done}/{len(self.sizes)})",
                       **{k: state[k] for k in ("current_file", "received_bytes", "total_bytes",
                                                "files_done", "files_total", "bytes_per_sec")}})

    def bar_class(self) -> type:
        """A tqdm stand-in ``huggingface_hub`` feeds the current file's bytes to."""
        progress = self

        class Bar:
            def __init__(self, *args: Any, initial: int = 0, **kwargs: Any):
                progress.file_bytes = int(initial or 0)
                progress.report()

            def __enter__(self) -> Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def update(self, n: float | None = 1) -> None:
                progress.file_bytes += int(n or 0)
                progress.report()

            def close(self) -> None:
                pass

        return Bar


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the job manager's cancel: unwind through the cleanup


def run(config: dict[str, Any], emit: Emit) -> dict[str, Any]:
    """The job body: fetch, verify, then make the snapshot visible."""
    from .transfer import fetch

    signal.signal(signal.SIGTERM, _on_sigterm)
    repo, revision, cache = config["repo"], config["revision"], Path(config["cache_dir"])
    if remote.offline():
        raise JobError(remote.explain(RuntimeError("offline")))
    from ..models.resolve import hub_unreachable

    why = hub_unreachable(remote.endpoint())
    if why is not None:
        raise JobError(f"offline: the hub {remote.endpoint()} cannot be reached ({why}); "
                       "models already downloaded still work")
    emit({"type": "stage", "stage": "resolve", "progress": 0.0, "message": f"asking the hub "
          f"about {repo}"})
    try:
        info = remote.api().model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:
        raise JobError(remote.explain(exc, repo)) from None
    sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    files = wanted_files(sorted(sizes))
    commit = info.sha
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    _check_space(cache, snapshot, {f: sizes[f] for f in files})
    had_snapshot = snapshot.is_dir() and not partial.incomplete(snapshot)
    ref = repo_dir / "refs" / revision
    old_ref = ref.read_text().strip() if ref.is_file() else None
    partial.mark(repo_dir, commit, repo)
    progress = Progress(repo, {f: sizes[f] for f in files}, emit)
    try:
        for name in files:
            progress.start_file(name)
            fetch(repo, name, commit, repo_dir, progress.bar_class())
            progress.end_file()
        _verify(snapshot, {f: sizes[f] for f in files})
        if revision != commit:
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(commit)
        partial.clear(repo_dir, commit)
    except BaseException as exc:
        _undo(repo_dir, snapshot, commit, had_snapshot, ref, old_ref)
        if isinstance(exc, KeyboardInterrupt):
            raise JobError("cancelled: the partial blobs are kept, so downloading it again "
                           "resumes") from None
        if isinstance(exc, JobError):
            raise
        raise JobError(remote.explain(exc, repo)) from None
    finally:
        progress.path.unlink(missing_ok=True)
    return {"output_dir": str(snapshot), "repo_id": repo, "revision": commit,
            "files": len(files), "bytes": progress.total}


def _check_space(cache: Path, snapshot: Path, sizes: dict[str, int]) -> None:
    """Refuse up front when the volume cannot hold the rest plus a reserve."""
    need = sum(size for name, size in sizes.items() if not (snapshot / name).exists())
    probe = cache
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need and free < need + RESERVE_BYTES:
        raise JobError(f"not enough disk: {need / 1e9:.2f} GB to download plus a "
                       f"{RESERVE_BYTES / 1e9:.1f} GB reserve, {free / 1e9:.2f} GB free at {probe}")


def _verify(snapshot: Path, sizes: dict[str, int]) -> None:
    for name, size in sizes.items():
        path = snapshot / name
        if not path.is_file():
            raise JobError(f"{name} is missing after the download")
        if size and path.stat().st_size != size:
            raise JobError(f"{name} has {path.stat().st_size} bytes, the hub says {size}")


def _undo(repo_dir: Path, snapshot: Path, commit: str, had_snapshot: bool, ref: Path,
          old_ref: str | None) -> None:
    """A failed or cancelled download leaves no half snapshot: its links and the ref
    it wrote go; blobs (whole ones and ``.incomplete`` prefixes) stay for the resume."""
    if not had_snapshot and snapshot.is_dir():
        for link in sorted(snapshot.rglob("*"), reverse=True):
            if link.is_symlink() or link.is_file():
                link.unlink()
            elif link.is_dir():
                link.rmdir()
        snapshot.rmdir()
    if old_ref is None:
        ref.unlink(missing_ok=True)
    elif ref.is_file() and ref.read_text().strip() != old_ref:
        ref.write_text(old_ref)
    partial.clear(repo_dir, commit)
