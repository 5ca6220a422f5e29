"""One GPU against two with NCCL, and mlxbun against ``mlx_lm.server`` launched the same way.

For each shape (random bf16 weights, llama layout) this starts, one after another:

1. ``mlxbun serve CKPT`` on one GPU (``CUDA_VISIBLE_DEVICES=0``);
2. ``mlx.launch -n 2 --backend nccl -- mlxbun serve CKPT --distributed``;
3. ``mlx.launch -n 2 --backend nccl -- python -m mlx_lm server --model CKPT`` (mlx-lm's own
   distributed server);

and measures, against each: single-stream decode tok/s (a 256-token greedy completion,
median of 3 after a warm-up), then aggregate tok/s with 8 and 32 concurrent clients (each
a 128-token greedy completion of a distinct prompt). A shape too large for one GPU is run
distributed only (``--skip-single``). Every server answers the same OpenAI
``/v1/completions`` request; EOS is never reached with random weights, so every run is
full length.

Run on a host with two GPUs (the H200 pair), from the repository root::

    .venv/bin/python bench/distributed.py --shapes 8b,32b --out bench/results/distributed.json
    .venv/bin/python bench/distributed.py --shapes 70b --skip-single   # too large for one

Targets (issue 22): two-GPU single-stream decode >= 1.5x one GPU at 32b; 32-client
aggregate >= 1.2x ``mlx_lm.server`` distributed. On this CPU box the same script runs with
``--backend ring --shapes tiny`` (two processes on one machine; a functional check, not a
speed one).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import bench_home  # this folder

# hidden, layers, heads, kv heads, intermediate: llama layouts of the named size class
SHAPES = {
    "tiny": (64, 2, 4, 2, 128),
    "small": (512, 8, 8, 4, 1536),  # ~40M: a CPU-sized run (two ranks on this box's cores)
    "8b": (4096, 36, 32, 8, 12288),  # Qwen3-8B's layout
    "32b": (5120, 64, 64, 8, 25600),  # Qwen3-32B's layout
    "70b": (8192, 80, 64, 8, 28672),  # Llama-3-70B's layout (~141 GB bf16: two H200s)
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkpoint(shape: str, root: Path) -> Path:
    """A random-weight bf16 llama checkpoint of ``shape`` (written once under ``root``)."""
    from mlxbun_core.testing.checkpoints import write_checkpoint

    hidden, layers, heads, kv, inter = SHAPES[shape]
    path = root / f"llama-{shape}"
    if not (path / "config.json").exists():
        write_checkpoint(path, "llama", dtype="bfloat16", vocab_size=32000, config_overrides={
            "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": inter,
            "head_dim": hidden // heads})
    return path


def launcher() -> str:
    found = shutil.which("mlx.launch") or str(Path(sys.executable).parent / "mlx.launch")
    return found


def commands(kind: str, ckpt: Path, port: int, backend: str) -> tuple[list[str], dict]:
    env = dict(os.environ)
    mlxbun = [sys.executable, "-m", "mlxbun_core.cli", "serve", str(ckpt), "--port", str(port),
              "--no-open", "--prompt-cache", "0"]
    launch = [launcher(), "-n", "2", "--backend", backend, "-p", str(free_port()), "--"]
    if kind == "single":
        env["CUDA_VISIBLE_DEVICES"] = "0"
        return mlxbun, env
    if kind == "mlxbun-2":
        return launch + mlxbun + ["--distributed"], env
    return launch + [sys.executable, "-m", "mlx_lm", "server", "--model", str(ckpt),
                     "--port", str(port)], env


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(base + "/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError("server did not come up")


def complete(base: str, prompt: str, tokens: int) -> tuple[int, float]:
    body = {"model": "default_model", "prompt": prompt, "max_tokens": tokens,
            "temperature": 0.0}
    t0 = time.perf_counter()
    r = httpx.post(base + "/v1/completions", json=body, timeout=1800)
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"]), time.perf_counter() - t0


def measure(base: str, clients: list[int]) -> dict:
    complete(base, "warm up", 16)
    single = [n / s for n, s in (complete(base, "Once upon a time", 256) for _ in range(3))]
    out = {"single_stream_tps": round(statistics.median(single), 2)}
    for n in clients:
        prompts = [f"Client {i} asks about topic {i * 7}" for i in range(n)]
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(n) as pool:
            done = list(pool.map(lambda p: complete(base, p, 128)[0], prompts))
        out[f"aggregate_tps_{n}"] = round(sum(done) / (time.perf_counter() - t0), 2)
    return out


def run(kind: str, ckpt: Path, backend: str, clients: list[int]) -> dict:
    port = free_port()
    cmd, env = commands(kind, ckpt, port, backend)
    log = Path(tempfile.mkdtemp(prefix="mlxbun-bench-")) / f"{kind}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        return {"server": kind, **measure(base, clients)}
    except Exception as exc:
        return {"server": kind, "error": str(exc), "log": str(log)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="8b,32b")
    p.add_argument("--backend", default="nccl", choices=("nccl", "ring", "jaccl"))
    p.add_argument("--clients", default="8,32")
    p.add_argument("--skip-single", action="store_true",
                   help="the shape does not fit one GPU: distributed runs only")
    p.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "mlxbun-bench-dist"))
    p.add_argument("--out", default=None)
    bench_home.add_flag(p)
    args = p.parse_args()
    bench_home.use(args.home)
    clients = [int(c) for c in args.clients.split(",") if c]
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for shape in args.shapes.split(","):
        ckpt = checkpoint(shape, root)
        kinds = (["mlxbun-2", "mlx_lm-2"] if args.skip_single
                 else ["single", "mlxbun-2", "mlx_lm-2"])
        rows = {kind: run(kind, ckpt, args.backend, clients) for kind in kinds}
        row = {"shape": shape, "backend": args.backend, "runs": rows}
        one, two, ref = rows.get("single", {}), rows["mlxbun-2"], rows["mlx_lm-2"]
        if "single_stream_tps" in one and "single_stream_tps" in two:
            row["two_vs_one_single_stream"] = round(two["single_stream_tps"]
                                                    / one["single_stream_tps"], 3)
        top = f"aggregate_tps_{max(clients)}" if clients else None
        if top and top in two and top in ref:
            row[f"vs_mlx_lm_{top}"] = round(two[top] / ref[top], 3)
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
