"""The eval DB, ``<home>/evals.sqlite``: every ``mlxbun bench`` run (table ``runs``) and
every task ``mlxbun evals run`` scored (table ``scores``, one row per task and run); what
``mlxbun evals`` lists, prints as JSON lines, or archives (``--clear``)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

COLUMNS = ("at", "stack", "model", "bench", "kv", "prompt_tokens", "decode_tokens", "runs",
           "prefill_tps", "decode_tps", "ttft_ms", "peak_bytes", "commit",
           "kv_bytes_per_token", "switches")
QUOTED = ", ".join(f'"{c}"' for c in COLUMNS)  # "commit" is an SQL keyword
SCHEMA = ("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, at REAL, stack TEXT, "
          "model TEXT, bench TEXT, kv TEXT, prompt_tokens INTEGER, decode_tokens INTEGER, "
          "runs INTEGER, prefill_tps REAL, decode_tps REAL, ttft_ms REAL, peak_bytes INTEGER, "
          "\"commit\" TEXT, kv_bytes_per_token REAL, switches TEXT)")
ADDED = {"kv_bytes_per_token": "REAL", "switches": "TEXT"}
"""Columns later than the first DBs: added to a DB that lacks them."""

SCORE_COLUMNS = ("at", "stack", "model", "task", "metric", "score", "n", "kv", "seconds",
                 "commit", "detail")
SCORE_QUOTED = ", ".join(f'"{c}"' for c in SCORE_COLUMNS)
SCORE_SCHEMA = ("CREATE TABLE IF NOT EXISTS scores (id INTEGER PRIMARY KEY, at REAL, "
                "stack TEXT, model TEXT, task TEXT, metric TEXT, score REAL, n INTEGER, "
                "kv TEXT, seconds REAL, \"commit\" TEXT, detail TEXT)")
"""``detail``: JSON, the task's further metrics and what each item gave."""


def path(home: Path) -> Path:
    return home / "evals.sqlite"


def _db(home: Path) -> sqlite3.Connection:
    home.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path(home))
    db.execute(SCHEMA)
    have = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    for column, kind in ADDED.items():
        if column not in have:
            db.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
    db.execute(SCORE_SCHEMA)
    return db


def record(home: Path, row: dict[str, Any]) -> None:
    with _db(home) as db:
        db.execute(f"INSERT INTO runs ({QUOTED}) VALUES ({', '.join('?' for _ in COLUMNS)})",
                   [row.get(c) for c in COLUMNS])


def rows(home: Path, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` runs, newest first."""
    if not path(home).is_file():
        return []
    with _db(home) as db:
        cur = db.execute(f"SELECT {QUOTED} FROM runs ORDER BY id DESC LIMIT ?", (limit,))
        return [dict(zip(COLUMNS, r, strict=True)) for r in cur.fetchall()]


def record_score(home: Path, row: dict[str, Any]) -> None:
    values = [json.dumps(row.get(c)) if c == "detail" else row.get(c) for c in SCORE_COLUMNS]
    with _db(home) as db:
        db.execute(f"INSERT INTO scores ({SCORE_QUOTED}) VALUES "
                   f"({', '.join('?' for _ in SCORE_COLUMNS)})", values)


def scores(home: Path, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` task scores, newest first (``detail`` parsed)."""
    if not path(home).is_file():
        return []
    with _db(home) as db:
        cur = db.execute(f"SELECT {SCORE_QUOTED} FROM scores ORDER BY id DESC LIMIT ?",
                         (limit,))
        out = [dict(zip(SCORE_COLUMNS, r, strict=True)) for r in cur.fetchall()]
    for r in out:
        r["detail"] = json.loads(r["detail"]) if r["detail"] else None
    return out


def clear(home: Path) -> Path | None:
    """Move the DB aside to a timestamped backup (None when there is none); the next run
    starts a fresh one."""
    db = path(home)
    if not db.is_file():
        return None
    backup = db.with_name(f"evals-{time.strftime('%Y%m%d-%H%M%S')}.sqlite")
    db.rename(backup)
    return backup


def score_row(model_id: str, kv: str, stack: str, task: str, metric: str, score: float,
              n: int, seconds: float, detail: dict[str, Any]) -> dict[str, Any]:
    from .measure import commit_label

    return {"at": time.time(), "stack": stack, "model": model_id, "task": task,
            "metric": metric, "score": score, "n": n, "kv": kv, "seconds": seconds,
            "commit": commit_label(), "detail": detail}


def summary(row: dict[str, Any]) -> str:
    extra = "".join(f", {k} {v:.3f}" for k, v in (row["detail"] or {}).items()
                    if isinstance(v, float))
    return (f"{row['model']}: {row['task']} {row['metric']} {row['score']:.3f} over "
            f"{row['n']} items{extra} (KV {row['kv']}, {row['seconds']:.1f} s)")


def print_scores(rows: list[dict[str, Any]]) -> None:
    """``mlxbun evals``' second table: the task scores, newest first."""
    print(f"\n{'when':<16} {'stack':<7} {'model':<32} {'task':<24} {'metric':<12} "
          f"{'score':>7} {'n':>5} {'KV':<6}  commit")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["at"]))
        print(f"{when:<16} {r['stack']:<7} {r['model'][-32:]:<32} {r['task'][-24:]:<24} "
              f"{r['metric'][-12:]:<12} {r['score']:>7.3f} {r['n']:>5} {r['kv']:<6}  "
              f"{r['commit']}")
