"""The engine of our own against the one it replaces and mlx_lm.server, same run.

Each arm is a fresh server process, alone on the device (an 80 GB card cannot hold two
8B servers under load), run in turn, with the arms' order rotating between rounds:

- ``paged``: this tree's engine (paged KV; on CUDA, direct attention over blocks);
- ``gather``: the same with direct attention off (the portable path: gathered blocks);
- ``heavy``: the same with mlx-lm's own forward for decode steps (no ``batch/lean.py``);
- ``lean``, ``fused``: the same with the decode step set (``MLXBUN_DECODE_STEP``: the lean
  step, or it with each layer's gate and up weights in one matmul) where ``paged`` times
  the ways at start on a GPU (``engine/batch/tune.py``);
- ``flash``: the same with the flash-decoding kernel (``batch/flash.py``) for direct attention;
- ``old``: the engine of another tree (``--old PATH``: a checkout whose ``mlxbun_core``
  drives mlx-lm's ``BatchGenerator``), when given;
- ``mlx-lm``: ``mlx_lm.server`` (``--decode-concurrency 32``), with ``--with-mlx-lm``.

Per arm and concurrency level: aggregate tok/s, median TTFT, median per-stream decode
tok/s, failures (the load of ``serve_concurrency.py``: random prompts of
``--prompt-tokens``, greedy, ``--max-tokens`` new tokens, ``--requests`` per client);
and a second chat turn over a ``--history-tokens`` history (its TTFT). Ratios are taken
within a round, against ``--baseline`` (default ``old`` when given, else ``mlx-lm``).

    python bench/engine_ab.py --rounds 1 --concurrency 1 8                  # CPU, tiny
    python bench/engine_ab.py --shape 8b --old /tmp/old --with-mlx-lm \\
        --concurrency 1 8 32 --rounds 2 --out bench/results/engine_ab_h100.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

import serve_concurrency  # this folder
from serve_concurrency import SHAPES, free_port, load_phase, random_prompt, second_turn, start

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def checkpoint(shape: str, bits: int = 0) -> str:
    from mlxbun_core.testing.checkpoints import write_checkpoint

    path = f"/tmp/bench-qwen3-{shape}-bfloat16"
    if not os.path.exists(os.path.join(path, "config.json")):
        write_checkpoint(path, "qwen3", seed=11, dtype="bfloat16",
                         config_overrides=SHAPES[shape])
    from prefix_stall import quantized  # this folder

    return quantized(path, bits)


# bench switches, not the server's: PAGED_KERNEL=flash (flash.py), PAGED_VECLOAD=0 (its
# scalar shared-memory loads), PAGED_MODE=gather (no direct attention)
BOOT_LOADS = ("import os; import mlxbun_core.engine.batch.flash as f; "
              "f.VECLOAD = os.environ.get('PAGED_VECLOAD', '1') != '0'; "
              "a.KERNEL = os.environ.get('PAGED_KERNEL', a.KERNEL); "
              "a.MODE = os.environ.get('PAGED_MODE', a.MODE); "
              f"import sys; sys.path.insert(0, {HERE!r}); import mem_log; mem_log.start(); ")


def arm_command(arm: str, args, ckpt: str, port: int) -> list:
    if arm == "mlx-lm":
        return [sys.executable, "-m", "mlx_lm.server", "--model", ckpt, "--port", str(port),
                "--decode-concurrency", "32", "--prompt-concurrency", "8"]
    tree = args.old if arm == "old" else ROOT
    path = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
    mode = {"gather": "gather"}.get(arm, "auto")
    boot = ("import sys; import mlxbun_core.engine.batch.attention as a; "
            f"a.MODE = {mode!r}; " + BOOT_LOADS if arm != "old" else "import sys; ")
    if arm == "flash":
        boot += "a.KERNEL = 'flash'; "
    if arm == "heavy":
        boot += "import mlxbun_core.engine.batch.lean as l; l.ENABLED = False; "
    if arm.startswith("paged@"):  # paged@CHUNK=128,WARPS=8,GROUP=4,VEC=1: the split-key
        for setting in arm[len("paged@"):].split(","):  # kernel's module settings
            name, value = setting.split("=")
            given = bool(int(value)) if name in ("VEC", "FUSED") else int(value)
            boot += f"a.{name} = {given!r}; "
    boot += "from mlxbun_core.cli import main; sys.argv[0] = 'mlxbun'; sys.exit(main())"
    step = {"fused": ["MLXBUN_DECODE_STEP=fused"], "lean": ["MLXBUN_DECODE_STEP=lean"]}
    cmd = ["env", f"PYTHONPATH={path}", *step.get(arm, []), sys.executable, "-c", boot,
           "serve", ckpt,
           "--port", str(port), "--no-open"]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    return cmd


async def measure(base: str, args, prompts, history: str, rng) -> dict:
    out: dict = {}
    t0 = time.perf_counter()
    await load_phase(base, 2, 1, prompts, 8)  # the first requests after /health said ready
    t1 = time.perf_counter()
    # the same work warm: two other prompts of the same length (the same two would hit the
    # prefix cache, and a first request is then measured against no prefill at all)
    await load_phase(base, 2, 1, prompts[2:], 8)
    out["first_request_s"], out["warm_request_s"] = t1 - t0, time.perf_counter() - t1
    for conc in args.concurrency:
        out[f"c{conc}"] = await load_phase(base, conc, args.requests, prompts, args.max_tokens)
        out[f"c{conc}"]["stats"] = await stats_of(base)
    if args.history_tokens:
        out["second_turn"] = await second_turn(base, history, rng)
    return out


async def stats_of(base: str) -> dict:
    """The server's /stats after a phase, where it has one (mlx_lm.server has not): what
    memory, the pool and the batch did (preemptions, waits, the step's room)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.get(base + "/stats")
        return r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


async def one_request(c, base: str, body: dict) -> dict:
    """``serve_concurrency.one_request``, keeping what a failed stream said."""
    t0, first, usage, last = time.perf_counter(), None, None, ""
    try:
        async with c.stream("POST", base + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False, "status": f"{r.status_code} {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                last = line[:300]
                obj = json.loads(line[6:])
                ch = (obj.get("choices") or [{}])[0]
                if ch.get("text") and first is None:
                    first = time.perf_counter()
                usage = obj.get("usage") or usage
    except Exception as exc:
        return {"ok": False, "status": type(exc).__name__}
    end = time.perf_counter()
    n = (usage or {}).get("completion_tokens", 0)
    if first is None or n == 0:
        return {"ok": False, "status": f"no tokens: {last}"}
    return {"ok": True, "ttft": first - t0, "tokens": n, "start": t0, "end": end,
            "decode_tps": (n - 1) / max(end - first, 1e-9)}


def run_arm(arm: str, args, ckpt: str, prompts, history: str, rng) -> dict:
    port = free_port()
    t0 = time.perf_counter()
    log = os.path.join(os.environ.get("OUT", "/tmp"), f"engine_ab_{arm}.log")
    proc = start(arm_command(arm, args, ckpt, port), port, log)
    try:
        res = asyncio.run(measure(f"http://127.0.0.1:{port}", args, prompts, history, rng))
        res["start_s"] = time.perf_counter() - t0
        return res
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except Exception:
            proc.kill()
            proc.wait(30)
        time.sleep(2)  # the device's memory back before the next arm starts


serve_concurrency.one_request = one_request  # load_phase's requests keep their errors


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--bits", type=int, default=0, help="quantize the checkpoint")
    p.add_argument("--old", help="a tree whose engine is the 'old' arm")
    p.add_argument("--with-mlx-lm", action="store_true")
    p.add_argument("--arms", nargs="*", help="only these arms")
    p.add_argument("--baseline")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--history-tokens", type=int, default=4096)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out")
    args = p.parse_args()
    arms = ["paged", "gather"] + (["old"] if args.old else []) + \
        (["mlx-lm"] if args.with_mlx_lm else [])
    arms = [a for a in arms if not args.arms or a in args.arms] + \
        [a for a in args.arms or [] if a.startswith("paged@") or a in ("heavy", "fused", "lean")]
    baseline = args.baseline or ("old" if args.old else "mlx-lm" if args.with_mlx_lm else "")
    ckpt = checkpoint(args.shape, args.bits)
    from pathlib import Path

    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(Path(ckpt))
    rng = random.Random(5)
    n = max(args.concurrency) * args.requests + 8
    prompts = [random_prompt(tok, args.prompt_tokens, rng) for _ in range(n)]
    history = random_prompt(tok, args.history_tokens, rng) if args.history_tokens else ""
    rounds = []
    for r in range(args.rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        got = {}
        for arm in order:
            print(f"round {r + 1}: {arm}", flush=True)
            got[arm] = run_arm(arm, args, ckpt, prompts, history, rng)
            print(json.dumps({arm: got[arm]}), flush=True)
        rounds.append(got)
    summary = report(rounds, arms, baseline, args)
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds, "summary": summary}, f, indent=1)


def report(rounds: list, arms: list, baseline: str, args) -> dict:
    out: dict = {}
    for arm in arms:
        row = {}
        for conc in args.concurrency:
            key = f"c{conc}"
            tps = [r[arm][key]["aggregate_tps"] for r in rounds]
            row[key] = {"tps": statistics.median(tps),
                        "ttft_s": statistics.median(r[arm][key]["ttft_median_s"] or 0
                                                    for r in rounds),
                        "failed": sum(r[arm][key]["failed"] for r in rounds)}
            base = [r[baseline][key]["aggregate_tps"] for r in rounds] if baseline in \
                rounds[0] else []
            if base and all(base) and arm != baseline:
                row[key]["ratio"] = statistics.median(
                    r[arm][key]["aggregate_tps"] / r[baseline][key]["aggregate_tps"]
                    for r in rounds)
        row["first_request_s"] = statistics.median(r[arm]["first_request_s"] for r in rounds)
        row["warm_request_s"] = statistics.median(r[arm]["warm_request_s"] for r in rounds)
        if args.history_tokens:
            row["second_turn_s"] = statistics.median(r[arm]["second_turn"]["second_ttft_s"]
                                                     for r in rounds)
        out[arm] = row
    return out


if __name__ == "__main__":
    main()
