"""Out-of-the-box batch size: mlxbun's default ``--batch`` against pinned caps, same run.

Arms, each a fresh server process every round with the order rotating between rounds:
``default`` (no ``--batch``: the cap sized from the device and the model, read back from
``/stats``), ``batch N`` for every ``--pin N``, and with ``--with-mlx-lm`` mlx_lm.server
(decode concurrency 32). Every arm serves ``--clients`` clients that each send
``--requests`` streaming /v1/completions requests back to back, each with its own random
``--prompt-tokens``-token prompt, greedy, ``--max-tokens`` new tokens (the load of
``bench/serve_concurrency.py``). Per arm: the cap it ran with, aggregate tok/s (all
completion tokens / wall time) as median (min-max) over rounds, median TTFT, failures,
and the aggregate as a ratio to the default's in the same round.

    python bench/batch_default.py --rounds 1 --clients 8              # tiny qwen3, CPU
    # the H200 question: default vs --batch 32 (and the old 8) at 32 clients, 8B bf16
    python bench/batch_default.py --shape 8b --clients 32 --pin 8 32 --with-mlx-lm \\
        --rounds 3 --out bench/results/batch_default_h200.json
    # the same with 4-bit weights (quantized with mlx-lm first, once)
    python bench/batch_default.py --shape 8b --bits 4 --clients 32 --pin 8 32 \\
        --rounds 3 --out bench/results/batch_default_h200_4bit.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
from pathlib import Path

import httpx

import bench_home  # this folder
from serve_concurrency import SHAPES, free_port, load_phase, random_prompt, start  # this folder


def checkpoint(args, dtype: str) -> str:
    """A random-weight Qwen3 of ``--shape`` (quantized to ``--bits`` when given)."""
    from mlxbun_core.testing.checkpoints import write_checkpoint

    ckpt = args.model or f"/tmp/bench-qwen3-{args.shape}-{dtype}"
    if not args.model and not os.path.exists(os.path.join(ckpt, "config.json")):
        write_checkpoint(ckpt, "qwen3", seed=11, dtype=dtype, config_overrides=SHAPES[args.shape])
    if not args.bits:
        return ckpt
    quantized = f"{ckpt}-q{args.bits}"
    if not os.path.exists(os.path.join(quantized, "config.json")):
        from mlx_lm import convert

        convert(ckpt, quantized, quantize=True, q_bits=args.bits)
    return quantized


def arms(args, ckpt: str) -> dict:
    mlxbun = [sys.executable, "-m", "mlxbun_core.cli", "serve", ckpt, "--no-open",
              "--log-level", "warning"]
    out = {"default": lambda port: mlxbun + ["--port", str(port)]}
    for n in args.pin:
        out[f"batch {n}"] = lambda port, n=n: mlxbun + ["--port", str(port), "--batch", str(n)]
    if args.with_mlx_lm:
        out["mlx_lm.server"] = lambda port: [sys.executable, "-m", "mlx_lm.server", "--model",
                                             ckpt, "--port", str(port)]
    return out


def cap_of(base: str):
    """The row cap a server runs with (mlxbun's /stats; None elsewhere)."""
    try:
        batch = httpx.get(base + "/stats", timeout=10).json()["batch"]
        return {"cap": batch["cap"], "source": batch.get("cap_source"),
                "why": (batch.get("auto") or {}).get("reason")}
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None, help="a checkpoint dir (default: random --shape)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--bits", type=int, default=None, help="quantize the weights first")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--pin", type=int, nargs="*", default=[32], help="--batch values to compare")
    ap.add_argument("--with-mlx-lm", action="store_true", help="add mlx_lm.server as an arm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)

    import mlx.core as mx
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    ckpt = checkpoint(args, dtype)
    tok = load_tokenizer(Path(ckpt))
    rng = random.Random(3)
    prompts = [random_prompt(tok, args.prompt_tokens, rng)
               for _ in range(args.clients * args.requests)]
    warm = [random_prompt(tok, args.prompt_tokens, rng) for _ in range(2)]
    commands = arms(args, ckpt)
    results = {name: [] for name in commands}
    caps = {}
    for rnd in range(args.rounds):
        names = list(commands)
        names = names[rnd % len(names):] + names[:rnd % len(names)]  # rotate the order
        for name in names:  # one server at a time: the arms never share the device
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            log_path = f"/tmp/bench-batch-{name.replace(' ', '')}.log"
            proc = start(commands[name](port), port, log_path)
            try:
                asyncio.run(load_phase(base, 2, 1, warm, 8))  # warm-up: kernels, caches
                caps[name] = cap_of(base)
                res = asyncio.run(load_phase(base, args.clients, args.requests, prompts,
                                             args.max_tokens))
            finally:
                proc.terminate()
                proc.wait(120)
            results[name].append(res)
            print(f"round {rnd} {name} (cap {caps[name] and caps[name]['cap']}): "
                  f"{res['aggregate_tps']:.1f} tok/s, ttft {res['ttft_median_s']}, "
                  f"failed {res['failed']}", flush=True)
    report(args, dtype, ckpt, results, caps)


def report(args, dtype, ckpt, results, caps):
    import mlx.core as mx

    rows = []
    for name, runs in results.items():
        tps = [r["aggregate_tps"] for r in runs]
        ratios = [r["aggregate_tps"] / d["aggregate_tps"]
                  for r, d in zip(runs, results["default"])]
        rows.append({"arm": name, "cap": caps.get(name), "tps_median": statistics.median(tps),
                     "tps_min": min(tps), "tps_max": max(tps),
                     "ratio_to_default": statistics.median(ratios),
                     "ttft_median_s": statistics.median(r["ttft_median_s"] for r in runs
                                                        if r["ttft_median_s"] is not None),
                     "failed": sum(r["failed"] for r in runs)})
    meta = {"device": str(mx.default_device()), "shape": args.shape, "dtype": dtype,
            "bits": args.bits, "checkpoint": ckpt, "clients": args.clients,
            "requests": args.requests, "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens, "rounds": args.rounds, "mlx": mx.__version__,
            "command": " ".join(sys.argv)}
    print(json.dumps(meta))
    print(f"{'arm':>14} {'cap':>4} {'tok/s':>9} {'min':>8} {'max':>8} {'x default':>9} "
          f"{'ttft s':>7} {'failed':>6}")
    for r in rows:
        cap = r["cap"]["cap"] if r["cap"] else "-"
        print(f"{r['arm']:>14} {cap!s:>4} {r['tps_median']:9.1f} {r['tps_min']:8.1f} "
              f"{r['tps_max']:8.1f} {r['ratio_to_default']:9.2f} {r['ttft_median_s']:7.3f} "
              f"{r['failed']:6d}")
    if caps.get("default"):
        print(f"default cap: {caps['default']['cap']} ({caps['default']['why']})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "arms": rows, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
