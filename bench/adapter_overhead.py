"""Does LoRA support cost the base path anything? Decode tok/s and greedy tokens of
the engine with no adapter mounted, run against two source trees alternately.

    python bench/adapter_overhead.py --trees /work/main /work/wt/adapters --rounds 5

Each round runs every tree in a fresh subprocess (same tiny checkpoint, same
prompt, 128 greedy tokens, serial and batched lanes); reported are median
tok/s per tree and lane, and whether every tree produced the same tokens.
With ``--adapter`` the last tree also runs with one adapter mounted and active.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import asyncio, json, sys, time
from mlxbun_core.engine.core import Engine
ckpt, batch, adapter = sys.argv[1], int(sys.argv[2]), sys.argv[3]
engine = Engine.load(ckpt, progress=False, batch=batch, prompt_cache_bytes=0)
spec = None
if adapter != "-":
    engine.worker.run_sync(lambda: engine.adapters.mount("a", adapter))
    spec = "a"
body = {"prompt": "Once upon a time", "max_tokens": 128, "temperature": 0, "logprobs": True,
        "adapter": spec}
async def one():
    gen = await engine.start(engine.parse_completion(dict(body)))
    evs = [e async for e in gen.events()]
    fin = evs[-1].finish
    return fin.timings.get("decode_tps", 0.0), [e["id"] for e in fin.logprobs]
asyncio.run(one())  # warm-up
tps, ids = [], None
for _ in range(3):
    t, ids = asyncio.run(one())
    tps.append(t)
print(json.dumps({"tps": max(tps), "ids": ids}), flush=True)
import os
os._exit(0)  # no interpreter teardown under a live MLX worker thread
"""


def run(tree: str, ckpt: str, batch: int, adapter: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-c", CHILD, ckpt, str(batch), adapter], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trees", nargs="+", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--adapter", action="store_true")
    args = p.parse_args()
    from mlxbun_core.testing.adapters import write_lora_adapter
    from mlxbun_core.testing.checkpoints import write_checkpoint

    tmp = tempfile.mkdtemp()
    ckpt = str(write_checkpoint(f"{tmp}/llama", "llama", dtype="float32"))
    adapter = str(write_lora_adapter(ckpt, f"{tmp}/a")) if args.adapter else None
    arms = [(t, "-") for t in args.trees] + ([(args.trees[-1], adapter)] if adapter else [])
    results: dict = {}
    for r in range(args.rounds):
        for batch in (1, 8):
            for tree, ad in (arms if r % 2 == 0 else arms[::-1]):
                got = run(tree, ckpt, batch, ad)
                key = (tree, batch, ad != "-")
                results.setdefault(key, {"tps": [], "ids": got["ids"]})["tps"].append(got["tps"])
    for batch in (1, 8):
        base_ids = None
        for tree, ad in arms:
            row = results[(tree, batch, ad != "-")]
            same = base_ids is None or row["ids"] == base_ids
            base_ids = base_ids or row["ids"]
            print(f"batch {batch} {tree}{' +adapter' if ad != '-' else ''}: median "
                  f"{statistics.median(row['tps']):.1f} tok/s over {len(row['tps'])} rounds "
                  f"{sorted(round(x) for x in row['tps'])}; tokens same as first: {same}")


if __name__ == "__main__":
    main()
