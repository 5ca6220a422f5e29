"""Host work per served decode step: the bare batch, the engine in-process, and the server.

A tiny random llama made deep and narrow (``--layers`` x ``--hidden``), so a forward pass
is cheap and the host work around it shows. ``--rows`` greedy rows of ``--prompt-tokens``
token-id prompts decode ``--tokens`` tokens each, three ways, in one run, the arms'
order alternating between ``--rounds`` rounds:

- ``bare``: ``Batch.decode`` in a loop in this process (``engine/batch/executor.py``), the
  floor: the step's own host work and forward;
- ``engine``: an :class:`~mlxbun_core.engine.core.Engine` in this process, every row
  started together, the events drained on an asyncio loop (no HTTP): the lane's step,
  sessions, the courier; the step times are read on the worker thread (the lane's step
  tally stamped at every decode step);
- ``served``: ``mlxbun serve`` in its own process, ``--rows`` streaming /v1/completions
  clients in this one (an asyncio loop, httpx): ms per step = 1 / the median stream's
  decode tok/s (first token to last).

Reported per arm: ms per decode step (median over rounds) and the arms' ratios to bare.
``--profile SECONDS`` records the server's threads with py-spy during one more served
run (``--profile-out``: its raw folded stacks). ``--served-env K=V`` adds a served arm
with that environment (an A/B of a server switch, e.g. ``MLXBUN_SWITCH_INTERVAL_MS=1``).

    python bench/host_overhead.py --rounds 5 --out bench/results/host_overhead_cpu.json
    python bench/host_overhead.py --model /tmp/bench-qwen3-8b-bfloat16 --arms bare,served \
        --prompt-tokens 512 --rounds 3 --profile 15        # a GPU (bench/h100_s43.sh d)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this tree
sys.path.insert(0, HERE)

import httpx  # noqa: E402
import mlx.core as mx  # noqa: E402

import bench_home  # noqa: E402  (this folder)


def checkpoint(layers: int, hidden: int) -> str:
    """A deep, narrow float32 llama (written once per shape under /tmp)."""
    from mlxbun_core.testing.checkpoints import write_checkpoint

    path = f"/tmp/bench-hostgap-llama-{layers}x{hidden}"
    if not os.path.exists(os.path.join(path, "config.json")):
        write_checkpoint(path, "llama", seed=7, dtype="float32", config_overrides={
            "num_hidden_layers": layers, "hidden_size": hidden,
            "intermediate_size": 2 * hidden, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": hidden // 4})
    return path


def prompts_for(rows: int, n: int, vocab: int) -> list[list[int]]:
    return [[5 + (i * 31 + j * 7) % (vocab - 10) for j in range(n)] for i in range(rows)]


# -- (a) the bare batch -------------------------------------------------------------
def bare(model, prompts, tokens: int) -> dict:
    from batch_step import decoding  # this folder

    b = decoding(model, prompts, tokens, direct_on=True)  # (as a server: the probe decides)
    names = {threading.get_native_id(): "MainThread"}
    before = cpu_by_thread(os.getpid(), names)
    steps = []
    while b.decoding:
        t0 = time.perf_counter()
        out = b.decode()
        steps.append(time.perf_counter() - t0)
        for e in out:
            if e.finish:
                b.remove(e.uid)
    out = per_step(steps)
    out["cpu_ms_per_step"] = cpu_per_step(before, cpu_by_thread(os.getpid(), names), len(steps))
    b.close()
    return out


def per_step(durations: list[float]) -> dict:
    full = durations[2:-2] or durations  # the pipeline's first and last steps differ
    return {"ms_per_step": 1e3 * statistics.median(full),
            "ms_mean": 1e3 * statistics.fmean(full), "steps": len(durations)}


# -- (b) the engine in this process ----------------------------------------------
class StampedTally:
    """The lane's step tally, stamped: the times of decode steps that carried at least
    three quarters of ``rows`` (a random model's row may meet EOS early)."""

    def __init__(self, tally, rows: int):
        self.tally, self.rows, self.times = tally, rows, []

    def add(self, rows: int) -> None:
        self.tally.add(rows)
        if 4 * rows >= 3 * self.rows:
            self.times.append(time.perf_counter())

    def __getattr__(self, name):
        return getattr(self.tally, name)


def engine_run(engine, prompts, tokens: int) -> dict:
    from mlxbun_core.engine.lanes.batch import BatchLane
    from mlxbun_core.testing.engine import finishes

    lane = next(lane for lane in engine.worker.lanes if isinstance(lane, BatchLane))
    stamped = StampedTally(lane.steps, len(prompts))
    lane.steps = lane._solo.steps = stamped
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    before = cpu_by_thread(os.getpid(), names)
    try:
        done = finishes(engine, [{"prompt": p, "max_tokens": tokens, "temperature": 0,
                                  "stream": True} for p in prompts], together=True)
    finally:
        lane.steps = lane._solo.steps = stamped.tally
    t = stamped.times
    out = per_step([b - a for a, b in zip(t, t[1:])])
    out["short_rows"] = sum(f.usage.completion_tokens < tokens for f in done)
    out["cpu_ms_per_step"] = cpu_per_step(before, cpu_by_thread(os.getpid(), names), tokens)
    return out


# -- (c) served over HTTP -----------------------------------------------------------
async def stream(c: httpx.AsyncClient, url: str, body: dict) -> dict:
    first = end = None
    n = 0
    async with c.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                if first is None:
                    first = time.perf_counter()
                if '"usage"' in line:
                    n = json.loads(line[6:])["usage"]["completion_tokens"] or n
    end = time.perf_counter()
    return {"tokens": n, "decode_s": end - first}


async def served_run(base: str, prompts, tokens: int) -> dict:
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as c:
        runs = await asyncio.gather(*[stream(c, base + "/v1/completions", {
            "prompt": p, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) for p in prompts])
    ms = [1e3 * r["decode_s"] / max(r["tokens"] - 1, 1) for r in runs]
    return {"ms_per_step": statistics.median(ms), "ms_max": max(ms),
            "short_rows": sum(r["tokens"] < tokens for r in runs)}


def served_arm(pid: int, base: str, prompts, tokens: int):
    """A served run, with the server's CPU ms per step by thread (all its steps: the
    prefill's too)."""
    names: dict[int, str] = {}

    def run() -> dict:
        if not names:
            names.update(thread_names(pid))
        before = cpu_by_thread(pid, names)
        out = asyncio.run(served_run(base, prompts, tokens))
        out["cpu_ms_per_step"] = cpu_per_step(before, cpu_by_thread(pid, names), tokens)
        return out
    return run


def thread_names(pid: int) -> dict[int, str]:
    """The server's threads by native id (py-spy reads their Python names)."""
    spy = py_spy()
    try:
        out = subprocess.run([spy, "dump", "--json", "-p", str(pid)], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # no py-spy: the threads unnamed
        return {}
    return {t["os_thread_id"]: t.get("thread_name") or str(t["os_thread_id"])
            for t in json.loads(out)}


def cpu_by_thread(pid: int, names: dict[int, str]) -> dict[str, float]:
    """CPU seconds each thread of ``pid`` has used (utime + stime): Python threads by
    name, the rest (MLX's, the runtime's; all of them without py-spy) as ``native``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except FileNotFoundError:
            continue
        name = names.get(int(tid), "native")
        if name.startswith("asyncio_"):
            name = "asyncio pool"
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_per_step(before: dict[str, float], after: dict[str, float], steps: int) -> dict:
    return {k: round(1e3 * (after[k] - before.get(k, 0.0)) / steps, 3) for k in after
            if after[k] - before.get(k, 0.0) > 0}


def serve(ckpt: str, rows: int, env: dict[str, str],
          budget: float | None = None) -> tuple[subprocess.Popen, str]:
    from serve_concurrency import free_port, start  # this folder

    port = free_port()
    log = os.path.join(tempfile.gettempdir(), f"mlxbun-hostgap-{port}.log")
    # -P: the code comes from PYTHONPATH, not the working directory (an arm's env may
    # name another tree's, for an A/B against it)
    cmd = [sys.executable, "-P", "-m", "mlxbun_core.cli", "serve", ckpt, "--port", str(port),
           "--no-open", "--batch", str(rows), "--prompt-cache", "0"]
    if budget:
        cmd += ["--memory-budget", str(budget)]
    old = dict(os.environ)
    os.environ.update(env)
    try:
        return start(cmd, port, log), f"http://127.0.0.1:{port}"
    finally:
        os.environ.clear()
        os.environ.update(old)


RATE = 200  # py-spy samples a second


def py_spy() -> str:
    """py-spy beside this interpreter (a venv), else on the PATH (a GPU machine's target
    install), else that name (the callers' OSError says it is missing)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.path.exists(beside) else shutil.which("py-spy") or "py-spy"


def gil_profile(pid: int, run, args, name: str) -> dict:
    """py-spy on the server for ``--profile`` seconds of served runs, sampling whichever
    thread holds the GIL: each thread's GIL-held ms per decode step (the work that
    serializes on a GPU, where the forward itself holds no core), and the raw stacks."""
    spy = py_spy()
    out = f"{args.profile_out}.{len(name)}.{abs(hash(name)) % 10**6}.txt"
    rec = subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(int(args.profile)),
                            "-r", str(RATE), "-f", "raw", "--threads", "--gil",
                            "--nonblocking", "-o", out],
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # (py-spy attaches)
    steps, t_end = 0, time.time() + args.profile - 2.0
    while time.time() < t_end:
        run()
        steps += args.tokens
    rec.wait()
    by_thread: dict[str, int] = {}
    with open(out) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            thread = stack.split(";")[0].split(": ", 1)[-1]
            thread = "asyncio pool" if thread.startswith("asyncio_") else thread
            by_thread[thread] = by_thread.get(thread, 0) + int(n)
    return {"stacks": out, "steps": steps, "gil_ms_per_step": {
        k: round(1e3 * v / RATE / steps, 3) for k, v in by_thread.items()}}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a checkpoint to run instead of the deep, narrow llama "
                    "(a GPU: the 8B body, where the forward takes no host core)")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--served-env", action="append", default=[],
                    help="K=V[,K=V]: one more served arm with this environment")
    ap.add_argument("--arms", default="bare,engine,served")
    ap.add_argument("--served-budget", type=float, default=None, metavar="GB",
                    help="the served arm's --memory-budget: on a GPU the bench process and "
                         "the server share the card (an 8B pair on an H100: 32)")
    ap.add_argument("--profile", type=float, default=0.0,
                    help="seconds of served runs per served arm under py-spy --gil")
    ap.add_argument("--profile-out", default="/tmp/hostgap-profile",
                    help="the raw stacks' file name stem")
    ap.add_argument("--out")
    return ap.parse_args()


def summary(got: dict[str, list]) -> dict:
    """Each arm's median ms per step and its same-round ratio to ``bare``."""
    out: dict = {}
    for name, runs in got.items():
        ms = [x["ms_per_step"] for x in runs]
        row = {"ms_per_step": statistics.median(ms), "rounds": runs}
        if "bare" in got:
            row["ratio_to_bare"] = statistics.median(
                a / b["ms_per_step"] for a, b in zip(ms, got["bare"]))
        out[name] = row
        print(f"{name:30s} {row['ms_per_step']:8.3f} ms/step"
              + (f"  x{row['ratio_to_bare']:.2f} bare" if "ratio_to_bare" in row else ""),
              flush=True)
    return out


def main() -> None:
    args = parse()
    bench_home.use()

    from mlx_lm import load

    from mlxbun_core.engine.core import Engine

    ckpt = args.model or checkpoint(args.layers, args.hidden)
    model, tok = load(ckpt)
    if mx.default_device() == mx.gpu:  # the server beside us measures free memory: our
        mx.set_cache_limit(2 << 30)    # freed buffers go back, not into MLX's cache
    prompts = prompts_for(args.rows, args.prompt_tokens, tok.vocab_size)
    wanted = args.arms.split(",")
    arms: dict = {}
    procs = []
    if "bare" in wanted:
        arms["bare"] = lambda: bare(model, prompts, args.tokens)
    if "engine" in wanted:
        engine = Engine.load(ckpt, progress=False, batch=args.rows, prompt_cache_bytes=0)
        arms["engine"] = lambda: engine_run(engine, prompts, args.tokens)
    servers = {"served": {}} if "served" in wanted else {}
    for spec in args.served_env:
        servers["served " + spec] = dict(kv.split("=", 1) for kv in spec.split(","))
    for name, env in servers.items():
        proc, base = serve(ckpt, args.rows, env, args.served_budget)
        procs.append(proc)
        arms[name] = served_arm(proc.pid, base, prompts, args.tokens)
    for fn in arms.values():  # warm-up: compile, fill MLX's cache, reach the steady state
        fn()
    got: dict[str, list] = {name: [] for name in arms}
    for r in range(args.rounds):
        order = list(arms.items())
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            got[name].append(fn())
        print(r, {k: (round(v[-1]["ms_per_step"], 3), v[-1]["cpu_ms_per_step"])
                  for k, v in got.items()}, flush=True)
    res: dict = {"args": vars(args), "device": str(mx.default_device()),
                 "date": time.strftime("%Y-%m-%d"), "arms": summary(got)}
    if args.profile:
        res["gil"] = {}
        for name, proc in zip(servers, procs):
            res["gil"][name] = gil_profile(proc.pid, arms[name], args, name)
            print(name, json.dumps(res["gil"][name]["gil_ms_per_step"]), flush=True)
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=60)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
