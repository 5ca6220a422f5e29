"""``mlxbun evals run --lm-eval TASK[,TASK]``: lm-evaluation-harness's tasks on a local
model, through a temporary server in this process (loopback, a free port) that lm-eval
reaches as ``local-completions`` (the legacy completions shapes docs/server.md describes);
each task's metrics become a row of the eval DB.

lm-eval is not a dependency of ours (it brings its own stack, torch among it): it runs as
its own command, found as ``--lm-eval-cmd``, else ``MLXBUN_LM_EVAL``, else ``lm_eval`` on
the PATH, else ``python -m lm_eval`` when this Python has it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

INSTALL = ("lm-eval is not installed: install it into any Python (`pip install "
           "'lm-eval[api]'`), then put its lm_eval on the PATH, or name it with "
           "--lm-eval-cmd PATH or MLXBUN_LM_EVAL")


class LmEvalFailed(RuntimeError):
    """lm-eval exited with an error or wrote no results."""


def add_flags(r: argparse.ArgumentParser) -> None:
    r.add_argument("--lm-eval", default=None, metavar="TASK[,TASK]",
                   help="run lm-evaluation-harness's tasks instead of the built-in ones, "
                        "through a temporary local server (local-completions)")
    r.add_argument("--lm-eval-cmd", default=None, metavar="CMD",
                   help="the lm_eval command (default: MLXBUN_LM_EVAL, else lm_eval on the "
                        "PATH, else python -m lm_eval)")
    r.add_argument("--include-path", default=None, metavar="DIR",
                   help="lm-eval's --include_path: a folder of your own task YAMLs")
    r.add_argument("--lm-eval-limit", type=int, default=None, metavar="N",
                   help="lm-eval's --limit: at most N documents per task")
    r.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="lm-eval's --batch_size: requests per call (default 1)")


def command(args: argparse.Namespace) -> list[str] | None:
    """The lm_eval command line to run, or None when there is none."""
    named = args.lm_eval_cmd or os.environ.get("MLXBUN_LM_EVAL")
    if named:
        parts = shlex.split(named)
        return parts if parts and shutil.which(parts[0]) else None
    if found := shutil.which("lm_eval"):
        return [found]
    if importlib.util.find_spec("lm_eval") is not None:
        return [sys.executable, "-m", "lm_eval"]
    return None


def missing(args: argparse.Namespace) -> str | None:
    """Why ``--lm-eval`` cannot run (None: it can)."""
    tasks = [t for t in args.lm_eval.split(",") if t.strip()]
    if not tasks:
        return "--lm-eval needs at least one task name"
    if command(args) is None:
        named = args.lm_eval_cmd or os.environ.get("MLXBUN_LM_EVAL")
        return f"no lm_eval command at {named!r}" if named else INSTALL
    return None


class _Server:
    """``serve``'s app over ``engine`` on a free loopback port, in a thread."""

    def __init__(self, engine: Any):
        import uvicorn

        from ..server.app import build_app
        from ..server.connections import ConnectionLimits, uvicorn_settings
        from .finder import free_port

        self.port = free_port()
        app = build_app(engine)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", **uvicorn_settings(ConnectionLimits(), app))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise LmEvalFailed("the temporary server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def _lm_eval_argv(cmd: list[str], base: str, model_id: str, args: argparse.Namespace,
                  out: Path) -> list[str]:
    tasks = [t.strip() for t in args.lm_eval.split(",") if t.strip()]
    argv = [*cmd, "--model", "local-completions", "--model_args",
            f"base_url={base}/v1/completions,model={model_id},tokenized_requests=True,"
            "num_concurrent=1,max_retries=1", "--tasks", ",".join(tasks),
            "--batch_size", str(args.batch_size), "--output_path", str(out)]
    if args.include_path:
        argv += ["--include_path", str(Path(args.include_path).resolve())]
    if args.lm_eval_limit is not None:
        argv += ["--limit", str(args.lm_eval_limit)]
    return argv


def _relay(argv: list[str]) -> tuple[int, str]:
    """Run lm-eval with its output passed on to stderr (stdout carries our rows); its
    exit status and its last lines."""
    lines: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            lines = [*lines[-19:], line]
    return proc.returncode, "".join(lines)


def run(path: str, model_id: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from .evaldb import score_row
    from .measure import load_engine

    cmd = command(args)
    assert cmd is not None  # (missing() said so first)
    engine = load_engine(path, model_id, args.kv_quant)
    t0 = time.perf_counter()
    try:
        server = _Server(engine)
        try:
            with tempfile.TemporaryDirectory(prefix="mlxbun-lm-eval-") as tmp:
                argv = _lm_eval_argv(cmd, f"http://127.0.0.1:{server.port}", model_id, args,
                                     Path(tmp))
                status, last = _relay(argv)
                found = sorted(Path(tmp).rglob("results_*.json"))
                if status != 0 or not found:
                    raise LmEvalFailed(f"lm-eval exited {status} with no results; its last "
                                       f"lines:\n{last}")
                results = json.loads(found[-1].read_text())
        finally:
            server.stop()
    finally:
        engine.close()
    seconds = time.perf_counter() - t0
    return [score_row(model_id, args.kv_quant, "mlxbun", f"lm-eval:{task}", *_primary(metrics),
                      _samples(results, task), seconds, metrics)
            for task, metrics in results.get("results", {}).items()]


def _primary(metrics: dict[str, Any]) -> tuple[str, float]:
    """A task's first metric (``acc,none`` → ``acc``) and its value."""
    for key, value in metrics.items():
        if "," in key and "_stderr" not in key and isinstance(value, (int, float)):
            return key.split(",")[0], float(value)
    raise LmEvalFailed(f"lm-eval reported no metric: {metrics}")


def _samples(results: dict[str, Any], task: str) -> int:
    counts = results.get("n-samples", {}).get(task, {})
    return int(counts.get("effective", counts.get("original", 0)))
