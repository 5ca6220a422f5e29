"""Jobs as data: one SQLite row per job plus its event log, byte-capped.

The row is what ``GET /api/jobs/<id>`` shows (status, progress, message, output,
error); the event log is what ``/stream`` replays. Events are the spec's JSON
objects (``started``, ``log``, ``stage``, ``metric``, ``done``, ``failed``); appending
one also moves the row (progress from ``stage``/``metric``, terminal status from
``done``/``failed``). One connection per call: SQLite in WAL mode serves the
server's threads and a CLI process at once.

Caps: a job keeps at most ``JOB_LOG_BYTES`` of ``log`` lines (then one notice and
silence) and ``JOB_EVENT_BYTES`` of events in all (then only terminal events);
the store keeps the newest ``MAX_JOBS`` jobs and at most ``TOTAL_EVENT_BYTES`` of
events, dropping the oldest finished jobs' logs first.
"""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..sqlitefile import opened

TERMINAL = ("done", "failed", "zombie")
JOB_LOG_BYTES = 256 << 10
JOB_EVENT_BYTES = 1 << 20
TOTAL_EVENT_BYTES = 64 << 20
MAX_JOBS = 200

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, status TEXT NOT NULL, config_json TEXT NOT NULL,
  progress REAL NOT NULL DEFAULT 0, message TEXT, log_path TEXT, output_path TEXT, error TEXT,
  pid INTEGER, owner_pid INTEGER, created REAL NOT NULL, started_at TEXT, ended_at TEXT,
  event_bytes INTEGER NOT NULL DEFAULT 0, log_bytes INTEGER NOT NULL DEFAULT 0,
  seq INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (job_id, seq));
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created);
"""

ROW_FIELDS = ("id", "kind", "status", "config_json", "progress", "message", "log_path",
              "output_path", "error", "started_at", "ended_at", "pid")


def iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(),
                                  timezone.utc).isoformat(timespec="seconds")


class JobStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        with opened(self.path, pragmas=("journal_mode=WAL",), schema=_SCHEMA, autocommit=True):
            pass

    def _db(self) -> AbstractContextManager[sqlite3.Connection]:
        return opened(self.path, timeout=30, autocommit=True, rows=True)

    # -- rows ----------------------------------------------------------------------
    def create(self, kind: str, config: dict, *, output_path: str | None = None,
               log_dir: Path | None = None, owner_pid: int | None = None) -> str:
        """A ``queued`` row owned by ``owner_pid`` (default: this process)."""
        job_id = f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        log_path = str(Path(log_dir) / f"{job_id}.log") if log_dir else None
        with self._db() as db:
            db.execute("INSERT INTO jobs (id, kind, status, config_json, output_path, log_path, "
                       "owner_pid, created) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)",
                       (job_id, kind, json.dumps(config), output_path, log_path,
                        owner_pid or os.getpid(), time.time()))
        self.prune()
        return job_id

    def get(self, job_id: str) -> dict | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row(row) if row else None

    # ``builtins.list`` below: inside the class ``list`` names this method
    def list(self, limit: int = 50, kind: str | None = None) -> builtins.list[dict]:
        sql, args = "SELECT * FROM jobs", []
        if kind:
            sql, args = sql + " WHERE kind = ?", [kind]
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY created DESC LIMIT ?", (*args, limit)).fetchall()
        return [_row(r) for r in rows]

    def set_pid(self, job_id: str, pid: int) -> None:
        with self._db() as db:
            db.execute("UPDATE jobs SET pid = ? WHERE id = ?", (pid, job_id))

    def require(self, job_id: str) -> dict:
        """:meth:`get` for a job that must exist (one this process created)."""
        row = self.get(job_id)
        if row is None:
            raise KeyError(f"no job {job_id!r}")
        return row

    def raw(self, job_id: str) -> sqlite3.Row | None:
        with self._db() as db:
            return db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()

    # -- events --------------------------------------------------------------------
    def append(self, job_id: str, event: dict) -> bool:
        """Store ``event`` (stamping ``ts``) and move the row; False when capped away.
        Events after a terminal one are ignored (the first ending wins)."""
        kind = event.get("type")
        event = {**event, "ts": event.get("ts", time.time())} if kind in (
            "started", "done", "failed") else event
        data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT status, event_bytes, log_bytes, seq FROM jobs WHERE id = ?",
                             (job_id,)).fetchone()
            if row is None or row["status"] in TERMINAL:
                db.execute("COMMIT")
                return False
            keep, notice = _admit(kind, len(data), row["event_bytes"], row["log_bytes"])
            seq = row["seq"]
            for text in ([notice] if notice else []) + ([data] if keep else []):
                seq += 1
                db.execute("INSERT INTO events (job_id, seq, data) VALUES (?, ?, ?)",
                           (job_id, seq, text))
            log_add = len(data) if keep and kind == "log" else 0
            if notice:  # past the log cap for good: the notice is said once
                log_add = JOB_LOG_BYTES + 1 - row["log_bytes"]
            sets, args = _row_update(event)
            sets += ["seq = ?", "event_bytes = event_bytes + ?", "log_bytes = log_bytes + ?"]
            db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?",
                       (*args, seq, len(data) if keep else 0, log_add, job_id))
            db.execute("COMMIT")
        return keep

    def events(self, job_id: str, after: int = 0) -> builtins.list[tuple[int, Any]]:
        """``[(seq, event)]`` after ``after``, in order."""
        with self._db() as db:
            rows = db.execute("SELECT seq, data FROM events WHERE job_id = ? AND seq > ? "
                              "ORDER BY seq", (job_id, after)).fetchall()
        return [(r["seq"], json.loads(r["data"])) for r in rows]

    def finish(self, job_id: str, status: str, error: str) -> bool:
        """End a job that did not end itself (process died, server restarted)."""
        if status == "zombie":
            with self._db() as db:
                cur = db.execute("UPDATE jobs SET status = 'zombie', error = ?, ended_at = ? "
                                 "WHERE id = ? AND status NOT IN ('done', 'failed', 'zombie')",
                                 (error, iso(), job_id))
                return cur.rowcount > 0
        return self.append(job_id, {"type": "failed", "error": error})

    def reap(self, alive: Callable[[int], bool] | None = None) -> builtins.list[str]:
        """Jobs left queued/running by a process that is gone become ``zombie``."""
        alive = alive or pid_alive
        with self._db() as db:
            rows = db.execute("SELECT id, owner_pid FROM jobs WHERE status IN "
                              "('queued', 'running')").fetchall()
        gone = [r["id"] for r in rows if not r["owner_pid"] or not alive(r["owner_pid"])]
        for job_id in gone:
            self.finish(job_id, "zombie", "the process that ran this job exited before it "
                        "finished (server restart or crash)")
        return gone

    def delete(self, job_id: str) -> bool:
        """Forget a job that has ended (its row and events); False when there is no such
        job or it has not ended: a running job is cancelled, never deleted."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute(f"DELETE FROM jobs WHERE id = ? AND status IN {TERMINAL}",
                             (job_id,))
            if cur.rowcount:
                db.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
            db.execute("COMMIT")
        return cur.rowcount > 0

    def prune(self) -> None:
        with self._db() as db:
            old = db.execute(f"SELECT id FROM jobs WHERE status IN {TERMINAL} "
                             "ORDER BY created DESC LIMIT -1 OFFSET ?", (MAX_JOBS,)).fetchall()
            for r in old:
                db.execute("DELETE FROM events WHERE job_id = ?", (r["id"],))
                db.execute("DELETE FROM jobs WHERE id = ?", (r["id"],))
            total = db.execute("SELECT COALESCE(SUM(event_bytes), 0) FROM jobs").fetchone()[0]
            if total <= TOTAL_EVENT_BYTES:
                return
            for r in db.execute(f"SELECT id, event_bytes FROM jobs WHERE status IN {TERMINAL} "
                                "AND event_bytes > 0 ORDER BY created").fetchall():
                db.execute("DELETE FROM events WHERE job_id = ? AND data LIKE '{\"type\":\"log\"%'",
                           (r["id"],))
                db.execute("UPDATE jobs SET event_bytes = (SELECT COALESCE(SUM(LENGTH(data)), 0) "
                           "FROM events WHERE job_id = ?) WHERE id = ?", (r["id"], r["id"]))
                total -= r["event_bytes"]
                if total <= TOTAL_EVENT_BYTES:
                    return


def _admit(kind: str | None, size: int, event_bytes: int,
           log_bytes: int) -> tuple[bool, str | None]:
    """``(keep, notice)``: whether an event fits the job's caps, plus a one-time notice."""
    if kind in ("done", "failed"):
        return True, None
    if kind == "log":
        if log_bytes + size <= JOB_LOG_BYTES and event_bytes + size <= JOB_EVENT_BYTES:
            return True, None
        if log_bytes <= JOB_LOG_BYTES:  # the first line over the cap: say so once
            return False, json.dumps({"type": "log", "line": "[log capped: later lines are "
                                      "in the job's log file]"})
        return False, None
    return event_bytes + size <= JOB_EVENT_BYTES, None


def _row_update(event: dict) -> tuple[list[str], list[float | str]]:
    kind = event.get("type")
    sets: list[str] = []
    args: list[float | str] = []
    if isinstance(event.get("progress"), (int, float)):
        sets.append("progress = ?")
        args.append(max(0.0, min(1.0, float(event["progress"]))))
    if kind == "started":
        sets += ["status = 'running'", "started_at = ?"]
        args.append(iso(event["ts"]))
    elif kind == "stage" and event.get("message") is not None:
        sets.append("message = ?")
        args.append(str(event["message"]))
    elif kind == "done":
        sets += ["status = 'done'", "progress = 1", "ended_at = ?"]
        args.append(iso(event["ts"]))
        if event.get("output_dir"):
            sets.append("output_path = ?")
            args.append(str(event["output_dir"]))
    elif kind == "failed":
        sets += ["status = 'failed'", "error = ?", "ended_at = ?"]
        args += [str(event.get("error") or "failed"), iso(event["ts"])]
    return sets, args


def _row(row: sqlite3.Row) -> dict:
    return {k: row[k] for k in ROW_FIELDS}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
