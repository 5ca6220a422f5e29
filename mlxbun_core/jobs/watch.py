"""``mlxbun train-watch``: follow a fine-tune job's events from another terminal.

The job is read from the home's job store (``jobs.sqlite``), so it is the same whether
``mlxbun train`` or the server (``/api/finetune/submit``, the web app) runs it: named by
its id, by its adapter directory, or left out for the newest fine-tune. One line per
stage and metric; the command ends with the job, 0 when it is done and 1 otherwise.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .store import TERMINAL, JobStore


def add_parser(sub) -> None:
    w = sub.add_parser("train-watch", help="follow a fine-tune job's progress (loss, speed, "
                                           "memory) until it ends")
    w.add_argument("target", nargs="?", default=None,
                   help="job id or adapter dir (default: the newest fine-tune job)")
    w.add_argument("--adapter", "--adapter-path", dest="adapter", default=None, metavar="DIR",
                   help="the job that writes this adapter dir")
    w.add_argument("--no-follow", action="store_true",
                   help="print what the job has said so far and exit")
    w.add_argument("--logs", action="store_true", help="also print the job's log lines")
    w.add_argument("--interval", type=float, default=0.5, help="seconds between polls")


def find_job(store: JobStore, target: str | None) -> dict | None:
    """A job by id, else the newest fine-tune writing to the directory ``target``."""
    if target and store.get(target):
        return store.get(target)
    jobs = store.list(limit=200, kind="finetune")
    if not target:
        return jobs[0] if jobs else None
    want = str(Path(target).expanduser().resolve())
    for job in jobs:
        adapter = json.loads(job["config_json"] or "{}").get("adapter_path")
        if adapter and str(Path(adapter).resolve()) == want:
            return job
    return None


def line(event: dict, iters: int | None, logs: bool) -> str | None:
    """How one event reads in the terminal (None: not shown)."""
    kind = event.get("type")
    if kind == "metric" and event.get("kind") == "train":
        of = f"/{iters}" if iters else ""
        parts = [f"step {event['step']}{of}", f"loss {event['loss']:.4f}"]
        if event.get("learning_rate") is not None:
            parts.append(f"lr {event['learning_rate']:.2e}")
        if event.get("tokens_per_sec") is not None:
            parts.append(f"{event['tokens_per_sec']:.0f} tok/s")
        if event.get("peak_memory_gb") is not None:
            parts.append(f"peak {event['peak_memory_gb']:.2f} GB")
        return "  ".join(parts)
    if kind == "metric":
        return f"step {event.get('step')}  {event.get('kind')} loss {event.get('loss', 0):.4f}"
    if kind == "stage":
        return f"[{event.get('stage')}] {event.get('message', '')}"
    if kind == "done":
        summary = " ".join(f"{k}={v}" for k, v in (event.get("summary") or {}).items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool))
        return f"done: {event.get('output_dir')}" + (f" ({summary})" if summary else "")
    if kind == "failed":
        return f"failed: {event.get('error')}"
    if kind == "log" and logs:
        return f"  {event.get('line')}"
    return None


def cmd_train_watch(args) -> int:
    from ..models.paths import mlxbun_home

    path = mlxbun_home() / "jobs.sqlite"
    target = args.adapter or args.target
    job = find_job(JobStore(path), target) if path.is_file() else None
    if job is None:
        what = f"for {target!r}" if target else "yet"
        print(f"mlxbun: no fine-tune job {what} in {path}", file=sys.stderr)
        return 2
    store = JobStore(path)
    iters = json.loads(job["config_json"] or "{}").get("iters")
    print(f"mlxbun: watching {job['id']} ({job['status']})", flush=True)
    seen = 0
    try:
        while True:
            status = store.require(job["id"])  # read before the events: none are missed
            for seq, event in store.events(job["id"], after=seen):
                seen = seq
                text = line(event, iters, args.logs)
                if text is not None:
                    print(text, flush=True)
            if status["status"] in TERMINAL or args.no_follow:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 130
    if status["status"] == "zombie":
        print(f"zombie: {status['error']}", flush=True)
    return 0 if status["status"] in ("done", "queued", "running") else 1
