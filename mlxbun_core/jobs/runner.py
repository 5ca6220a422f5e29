"""Jobs run in a subprocess: ``python -m mlxbun_core.jobs.runner KIND CONFIG EVENTS_FD``.

The child runs one runner (fine-tune, quantize) and writes its events as JSON lines
to ``EVENTS_FD``; its stdout/stderr (library chatter, tracebacks) become ``log``
events and the job's log file. The parent (:class:`JobManager`, in the server or
the CLI) stores every event, and when the child exits without a ``done`` or
``failed`` of its own (killed, crashed) records ``failed`` with the exit status.
Serving keeps answering meanwhile: the child owns its own MLX.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from .events import Emit, JobError
from .store import TERMINAL, JobStore

log = logging.getLogger("mlxbun.jobs")

LOG_FILE_BYTES = 4 << 20
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# What runs each kind of job, as "module:function" (the child imports only its own). The
# training kinds are ours; other rooms add theirs by giving their manager ``runners=`` (the
# hub's downloads, pushes and dataset builds), so this module knows none of them.
RUNNERS = {"finetune": "mlxbun_core.jobs.finetune:run",
           "quantize": "mlxbun_core.jobs.quantize:run"}


def runner(target: str) -> Callable[[dict, Emit], dict | None]:
    """The function ``target`` ("module:function") names."""
    import importlib

    module, _, name = target.partition(":")
    fn: Callable[[dict, Emit], dict | None] = getattr(importlib.import_module(module), name)
    return fn


# -- the child ------------------------------------------------------------------------
def child_main(argv: list[str] | None = None) -> int:
    target, config_path, fd = (argv or sys.argv[1:])[:3]
    out = os.fdopen(int(fd), "w", buffering=1)

    def emit(event: dict) -> None:
        out.write(json.dumps(event, ensure_ascii=False) + "\n")

    emit({"type": "started"})
    try:
        config = json.loads(Path(config_path).read_text())
        summary = runner(target)(config, emit) or {}
    except JobError as exc:
        emit({"type": "failed", "error": str(exc)})
        return 1
    except BaseException as exc:
        traceback.print_exc()
        emit({"type": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    emit({"type": "done", "output_dir": summary.pop("output_dir", None), "summary": summary})
    return 0


# -- the parent -----------------------------------------------------------------------
class JobManager:
    """Runs jobs one at a time in subprocesses and records them in a :class:`JobStore`."""

    def __init__(self, store: JobStore, home: Path,
                 runners: dict[str, str] | None = None):
        self.store = store
        self.home = Path(home)
        self.runners = {**RUNNERS, **(runners or {})}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._procs: dict[str, subprocess.Popen] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        for job_id in store.reap():
            log.warning("job %s was left unfinished by an earlier process: marked zombie", job_id)

    def submit(self, kind: str, config: dict, output_path: str | None = None) -> str:
        """Queue a job; the server's job thread starts it when the one before ends."""
        job_id = self.store.create(kind, config, output_path=output_path, log_dir=self._dir())
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="mlxbun-jobs", daemon=True)
            self._thread.start()
        self._queue.put(job_id)
        return job_id

    def run(self, kind: str, config: dict, on_event: Callable[[dict], None] | None = None,
            output_path: str | None = None) -> dict:
        """Run a job now in the foreground (the CLI); returns its final row."""
        job_id = self.store.create(kind, config, output_path=output_path, log_dir=self._dir())
        self.execute(job_id, on_event)
        return self.store.require(job_id)

    def close(self) -> None:
        """Server stop: end running children; their jobs are recorded as failed."""
        self._closed = True
        self._queue.put(None)
        for job_id, proc in list(self._procs.items()):
            if proc.poll() is None:
                proc.terminate()
            self.store.finish(job_id, "failed", "the server stopped while this job ran")

    def cancel(self, job_id: str) -> bool:
        """Stop a running job (SIGTERM: its body may clean up) or drop a queued one."""
        proc = self._procs.get(job_id)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            return True
        row = self.store.get(job_id)
        if row is not None and row["status"] == "queued":
            return self.store.finish(job_id, "failed", "cancelled before it started")
        return False

    def _serve(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id is None or self._closed:
                return
            row = self.store.get(job_id)
            if row is None or row["status"] in TERMINAL:  # cancelled while queued
                continue
            try:
                self.execute(job_id)
            except Exception:  # never let one job stop the queue
                log.exception("job %s could not run", job_id)
                self.store.finish(job_id, "failed", "the job could not be started")

    def _dir(self) -> Path:
        d = self.home / "jobs"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def execute(self, job_id: str, on_event: Callable[[dict], None] | None = None) -> None:
        row = self.store.raw(job_id)
        if row is None:
            raise KeyError(f"no job {job_id!r}")
        cfg_path = self._dir() / f"{job_id}.json"
        cfg_path.write_text(row["config_json"])
        log_path = Path(row["log_path"] or self._dir() / f"{job_id}.log")
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mlxbun_core.jobs.runner", self.runners[row["kind"]],
                 str(cfg_path),
                 str(write_fd)], pass_fds=(write_fd,), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "dumb", "NO_COLOR": "1"})
        finally:
            os.close(write_fd)
        self._procs[job_id] = proc
        self.store.set_pid(job_id, proc.pid)
        log.info("job %s (%s) started as pid %d", job_id, row["kind"], proc.pid)

        def record(event: dict) -> None:
            if self.store.append(job_id, event) and on_event is not None:
                on_event(event)

        output = threading.Thread(target=_pump_output, args=(proc.stdout, log_path, record),
                                  daemon=True)
        output.start()
        try:
            with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as events:
                for line in events:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(event, dict) and isinstance(event.get("type"), str):
                        record(event)
            code = proc.wait()
        except KeyboardInterrupt:  # the CLI's Ctrl-C: stop the child, record why
            proc.terminate()
            proc.wait()
            record({"type": "failed", "error": "interrupted"})
            raise
        finally:
            output.join(timeout=5)
            self._procs.pop(job_id, None)
        if self.store.require(job_id)["status"] not in TERMINAL:
            record({"type": "failed", "error": _exit_reason(code)})
        log.info("job %s ended: %s", job_id, self.store.require(job_id)["status"])


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the job process was killed ({name}) before it finished"
    return f"the job process exited with status {code} before it finished"


def _pump_output(stream, log_path: Path, record) -> None:
    """Child stdout/stderr → the log file (capped) and ``log`` events (capped by the store)."""
    written = 0
    with open(log_path, "ab") as f:
        for raw in iter(stream.readline, b""):
            if written < LOG_FILE_BYTES:
                f.write(raw[: LOG_FILE_BYTES - written])
                f.flush()
                written += len(raw)
            for piece in raw.decode("utf-8", "replace").replace("\r", "\n").split("\n"):
                line = _ANSI.sub("", piece).rstrip()
                if line:
                    record({"type": "log", "line": line[:2000]})


if __name__ == "__main__":
    from mlxbun_core.torchless import keep_torch_out

    keep_torch_out()  # seconds of every job's start that transformers spends on it
    sys.exit(child_main())


class Jobs:
    """A home's job manager, made (and stale jobs reaped) on first use: no ``jobs.sqlite``
    until a job is asked for. ``runners`` adds job kinds (see :data:`RUNNERS`)."""

    runners: dict[str, str] = {}

    def __init__(self, home: Path):
        self.home = Path(home)
        self._manager: JobManager | None = None

    @property
    def manager(self) -> JobManager:
        if self._manager is None:
            self._manager = JobManager(JobStore(self.home / "jobs.sqlite"), self.home,
                                       runners=self.runners)
        return self._manager

    @property
    def store(self) -> JobStore:
        return self.manager.store

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
