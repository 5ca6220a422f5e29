"""Another process takes the device's memory while 32 clients are served (issue #34).

One server (``mlxbun serve``, 8B bf16 random weights by default) is started and warmed;
then, ``--trials`` times: a second process (torch, as another tenant's job would be)
takes all but ``--leave-gb`` of the device's free memory and holds it while ``--clients``
streaming requests arrive; every answer is classed (200 with tokens, 503 with or without
``Retry-After``, other 5xx, other), ``/health`` is read under pressure; the other process
leaves, the same load runs again (full speed should return without a restart) and
``/health`` is read again. At the end the server is stopped: its exit status and whether
it aborted are recorded.

    python bench/memory_pressure.py --trials 5 --out bench/results/memory_pressure_h100.json

``--two-servers``: no other process; two servers of the same model share the card and
are loaded at once (``--clients`` each), ``--trials`` rounds: neither may die or answer
a 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time

import httpx

from serve_concurrency import free_port, random_prompt, start  # this folder

HOG = r"""
import sys, time, torch
leave = int(float(sys.argv[1]) * 2**30)
free, total = torch.cuda.mem_get_info()
take = max(0, free - leave)
held = torch.empty(take, dtype=torch.uint8, device="cuda")
print(f"held {take / 2**30:.1f} GiB of {total / 2**30:.1f} (free was {free / 2**30:.1f})",
      flush=True)
sys.stdin.read()
"""


async def one(c: httpx.AsyncClient, base: str, prompt: str, max_tokens: int) -> dict:
    body = {"prompt": prompt, "stream": True, "max_tokens": max_tokens, "temperature": 0}
    t0, tokens = time.perf_counter(), 0
    try:
        async with c.stream("POST", base + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return {"class": str(r.status_code), "retry_after": r.headers.get("retry-after"),
                        "s": time.perf_counter() - t0}
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    obj = json.loads(line[6:])
                    if "error" in obj:
                        return {"class": "stream_error", "error": str(obj["error"])[:200]}
                    if (obj.get("choices") or [{}])[0].get("text"):
                        tokens += 1
    except Exception as exc:  # a dropped connection: the server died?
        return {"class": type(exc).__name__, "s": time.perf_counter() - t0}
    return {"class": "200" if tokens else "200_empty", "tokens": tokens,
            "s": time.perf_counter() - t0}


async def load(base: str, prompts: list, clients: int, max_tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=900) as c:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*[one(c, base, prompts[i % len(prompts)], max_tokens)
                                      for i in range(clients)])
        wall = time.perf_counter() - t0
    classes: dict[str, int] = {}
    for r in runs:
        classes[r["class"]] = classes.get(r["class"], 0) + 1
    retry = [r["retry_after"] for r in runs if r["class"] == "503"]
    return {"classes": classes, "wall_s": round(wall, 2),
            "tps": round(sum(r.get("tokens", 0) for r in runs) / wall, 1),
            "retry_after": sorted(set(retry)),
            "errors": sorted({r.get("error", "") for r in runs if r.get("error")})[:3]}


def memory_stats(base: str) -> dict:
    """The server's ``/stats`` memory and KV pool figures (what pressure did)."""
    try:
        got = httpx.get(base + "/stats", timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {"memory": got.get("memory"), "kv_blocks": (got.get("batch") or {}).get("kv_blocks")}


def health(base: str) -> int | str:
    try:
        return httpx.get(base + "/health", timeout=10).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def trial(base: str, prompts: list, args) -> dict:
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(args.leave_gb)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = hog.stdout.readline().strip() if hog.stdout else ""
    out: dict = {"hog": line}
    try:
        out["under_pressure"] = asyncio.run(load(base, prompts, args.clients, args.max_tokens))
        out["health_under_pressure"] = health(base)
        out["stats_under_pressure"] = memory_stats(base)
    finally:
        if hog.stdin:
            hog.stdin.close()
        hog.wait(60)
    time.sleep(2)
    out["after"] = asyncio.run(load(base, prompts, args.clients, args.max_tokens))
    out["health_after"] = health(base)
    out["stats_after"] = memory_stats(base)
    return out


def serve(ckpt: str, args, log_name: str) -> tuple[subprocess.Popen, str, str]:
    """A started ``mlxbun serve`` of ``ckpt``: the process, its base URL, its log."""
    port = free_port()
    log = os.path.join(os.environ.get("OUT", "/tmp"), log_name)
    from engine_ab import BOOT_LOADS

    boot = ("import sys; import mlxbun_core.engine.batch.attention as a; " + BOOT_LOADS
            + "from mlxbun_core.cli import main; sys.argv[0] = 'mlxbun'; sys.exit(main())")
    cmd = [sys.executable, "-c", boot, "serve", ckpt, "--port", str(port),
           "--no-open", "--memory-wait", str(args.memory_wait)]
    return start(cmd, port, log), f"http://127.0.0.1:{port}", log


def stop(proc: subprocess.Popen) -> int | str:
    proc.terminate()
    try:
        return proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "killed after 120 s"


def log_verdict(log: str) -> dict:
    with open(log, errors="replace") as f:
        text = f.read()
    return {"aborted": any(s in text for s in ("double free", "Aborted", "core dumped",
                                               "terminate called")),
            "server_log_tail": text[-1500:]}


def two_servers(ckpt: str, prompts: list, args) -> None:
    """Two servers on one card, loaded at once: each round's answers, both healths."""
    servers = [serve(ckpt, args, f"two_servers_{i}.log") for i in (0, 1)]
    out: dict = {"args": vars(args), "rounds": []}

    async def both() -> list:
        return list(await asyncio.gather(*[load(base, prompts, args.clients, args.max_tokens)
                                           for _, base, _ in servers]))
    try:
        for i in range(args.trials):
            got = {"loads": asyncio.run(both()),
                   "health": [health(base) for _, base, _ in servers],
                   "stats": [memory_stats(base) for _, base, _ in servers],
                   "alive": [proc.poll() is None for proc, _, _ in servers]}
            out["rounds"].append(got)
            print(f"round {i + 1}", json.dumps(got), flush=True)
            if not all(got["alive"]):
                break
    finally:
        out["exit_codes"] = [stop(proc) for proc, _, _ in servers]
    out["logs"] = [log_verdict(log) for _, _, log in servers]
    print("exit", out["exit_codes"], "aborted", [v["aborted"] for v in out["logs"]], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8b")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--leave-gb", type=float, default=8.0)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--memory-wait", type=float, default=20.0)
    p.add_argument("--two-servers", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    from engine_ab import checkpoint

    ckpt = checkpoint(args.shape)
    from pathlib import Path

    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(Path(ckpt))
    rng = random.Random(7)
    prompts = [random_prompt(tok, args.prompt_tokens, rng) for _ in range(args.clients)]
    if args.two_servers:
        two_servers(ckpt, prompts, args)
        return
    proc, base, log = serve(ckpt, args, "memory_pressure_server.log")
    out: dict = {"args": vars(args), "trials": []}
    try:
        out["baseline"] = asyncio.run(load(base, prompts, args.clients, args.max_tokens))
        print("baseline", json.dumps(out["baseline"]), flush=True)
        for i in range(args.trials):
            got = trial(base, prompts, args)
            got["server_alive"] = proc.poll() is None
            out["trials"].append(got)
            print(f"trial {i + 1}", json.dumps(got), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(out, f, indent=1)
            if not got["server_alive"]:
                break
    finally:
        out["exit_code"] = stop(proc)
    out.update(log_verdict(log))
    print("exit", out["exit_code"], "aborted", out["aborted"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
