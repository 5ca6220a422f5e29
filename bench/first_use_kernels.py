"""Which CUDA kernels a server compiles after it said ready, and what each phase cost.

MLX compiles some kernels at first use (NVRTC) and keeps them in a PTX cache on disk
(``MLX_PTX_CACHE_DIR``), so a fresh machine's first server pays what every later one
skips: on an H100 the first server's warm pair of 8-token requests took 3.2-4.7 s against
0.5 s on the machine's fourth server. This starts a server with an empty cache, then after
each phase lists the modules the phase added to it (named by MLX after the kernel and its
template arguments): what the warm-up (``batch/warm.py``) should run and does not.

    python bench/first_use_kernels.py --shape 8b [--bits 4] [--out first_use.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_ab import arm_command, checkpoint  # this folder
from serve_concurrency import free_port, load_phase, random_prompt, start

PHASES = (("pair", 2, 8), ("pair_again", 2, 8), ("c3", 3, 32), ("c32", 32, 64),
          ("c32_again", 32, 64))


def modules(cache: str) -> dict[str, float]:
    """The cache's modules by name, with their write times."""
    out = {}
    for root, _, files in os.walk(cache):
        for f in files:
            if f.endswith(".ptx"):
                path = os.path.join(root, f)
                out[os.path.relpath(path, cache)[:-4][:160]] = os.path.getmtime(path)
    return out


async def phases(base: str, prompts: list[str], cache: str) -> list[dict]:
    out = []
    seen = modules(cache)
    warmed = sorted(m for m in seen if m.startswith(("qmm", "gather")))  # the usual suspects
    out.append({"phase": "ready", "modules": len(seen), "qmm_and_gather": warmed})
    print(json.dumps(out[-1]), flush=True)
    for name, conc, tokens in PHASES:
        t0 = time.perf_counter()
        got = await load_phase(base, conc, 1, prompts, tokens)
        wall = time.perf_counter() - t0
        now = modules(cache)
        new = sorted((t, m) for m, t in now.items() if m not in seen)
        seen = now
        row = {"phase": name, "clients": conc, "tokens": tokens, "wall_s": round(wall, 2),
               "ttft_median_s": got.get("ttft_median_s"), "failed": got.get("failed"),
               "new_modules": [m for _, m in new]}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="tiny")
    p.add_argument("--bits", type=int, default=0)
    p.add_argument("--arm", default="paged")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--out")
    args = p.parse_args()
    args.batch, args.old = 32, None
    ckpt = checkpoint(args.shape, args.bits)
    from pathlib import Path

    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(Path(ckpt))
    rng = random.Random(5)
    prompts = [random_prompt(tok, args.prompt_tokens, rng) for _ in range(40)]
    cache = tempfile.mkdtemp(prefix="ptx-")
    os.environ["MLX_PTX_CACHE_DIR"] = cache
    port = free_port()
    log = os.path.join(os.environ.get("OUT", "/tmp"), f"first_use_{args.bits or 16}.log")
    t0 = time.perf_counter()
    proc = start(arm_command(args.arm, args, ckpt, port), port, log)
    started = time.perf_counter() - t0
    try:
        rows = asyncio.run(phases(f"http://127.0.0.1:{port}", prompts, cache))
    finally:
        proc.terminate()
        proc.wait(60)
    result = {"args": vars(args), "start_s": round(started, 1), "phases": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
