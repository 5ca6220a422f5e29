"""The batch's decode step against mlx-lm's ``BatchGenerator``, same process, same rows.

Both decode ``--rows`` greedy rows of ``--prompt-tokens`` random prompt tokens for
``--tokens`` steps after their prefill; rounds alternate which goes first. Reported
per arm: decode tok/s (median over ``--rounds``) and the same-round ratio ours / theirs;
and, for ours, the host time one step spends building its pass (the block tables, the
per-layer cache objects) against the step's wall time: the block pool's per-step
overhead.

    python bench/batch_step.py --rows 8 32 --rounds 5 --out bench/results/batch_step_cpu.json
    python bench/batch_step.py --shape 8b --bits 4 --unpack --direct ...   # 4-bit, GPU

``--unpack`` adds an arm on a second copy of the model whose quantized layers dequantize
for wide passes (``engine/wide_quant.py``), with direct attention when ``--direct``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator

from mlxbun_core.engine.batch import direct, lean, pool_for
from mlxbun_core.engine.batch.executor import Batch
from mlxbun_core.engine.batch.layout import layout


def decoding(model, prompts, tokens, direct_on: bool = False) -> Batch:
    """A batch of ``prompts`` prefilled and past its first decode step (the pipeline
    primed), each row with ``tokens`` steps to go: where a step's timing starts."""
    b = Batch(model, layout(model), pool_for(layout(model), None))
    if direct_on:  # as a server: the probes decide
        direct.probe(b)
        lean.probe(b)
    for i, p in enumerate(prompts):
        b.add(i, p, budget=tokens + 1)
    while b.prefilling:
        b.prefill({u: 4096 for u in b.prefilling})
    b.decode()
    mx.synchronize()
    return b


def ours(model, prompts, tokens, direct_on: bool = False) -> dict:
    b = decoding(model, prompts, tokens, direct_on)
    host, n = 0.0, 0
    t0 = time.perf_counter()
    while b.decoding:
        h0 = time.perf_counter()
        out = b.decode()
        host += time.perf_counter() - h0  # (includes waiting for the previous step)
        for e in out:
            n += 1
            if e.finish:
                b.remove(e.uid)
    wall = time.perf_counter() - t0
    b.close()
    return {"tps": n / wall, "wall_s": wall}


def theirs(model, prompts, tokens) -> dict:
    gen = BatchGenerator(model, completion_batch_size=len(prompts),
                         prefill_batch_size=len(prompts))
    gen.insert(prompts, max_tokens=[tokens + 1] * len(prompts))
    left, n, t0 = len(prompts), 0, None
    while left:
        out = gen.next_generated()
        if t0 is None:  # the prefill turn (and the first tokens)
            mx.synchronize()
            t0 = time.perf_counter()
            left -= sum(r.finish_reason is not None for r in out)
            continue
        for r in out:
            n += 1
            left -= r.finish_reason is not None
    wall = time.perf_counter() - t0
    gen.close()
    return {"tps": n / wall, "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", help="a checkpoint (default: the tiny qwen3 test checkpoint)")
    p.add_argument("--shape", help="a random qwen3 body of serve_concurrency.SHAPES (8b, ...)")
    p.add_argument("--bits", type=int, default=0, help="with --shape: quantize it")
    p.add_argument("--unpack", action="store_true",
                   help="also ours on a model whose quantized layers dequantize when wide")
    p.add_argument("--rows", type=int, nargs="+", default=[8, 32])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--direct", action="store_true",
                   help="also ours with direct attention over blocks (the CUDA kernel)")
    p.add_argument("--flash", action="store_true", help="direct attention by the flash kernel")
    p.add_argument("--scalar-loads", action="store_true",
                   help="the flash kernel copies keys and values one by one")
    p.add_argument("--out")
    args = p.parse_args()
    from mlxbun_core.engine.batch import attention, flash

    if args.flash:
        attention.KERNEL = "flash"
    if args.scalar_loads:
        flash.VECLOAD = False
    if args.shape:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from prefix_stall import checkpoint

        args.model = checkpoint(args.shape, args.bits)
    if args.model is None:
        from mlxbun_core.testing.checkpoints import tiny_checkpoint

        args.model = str(tiny_checkpoint("qwen3", seed=3))
    model = load(args.model)[0]
    unpacked = None
    if args.unpack:
        from mlxbun_core.engine import wide_quant

        unpacked = load(args.model)[0]
        print("unpacked layers:", wide_quant.install(unpacked, wide_quant.CUDA_MIN_ROWS),
              flush=True)
    out: dict = {"args": vars(args), "device": str(mx.default_device())}
    for rows in args.rows:
        prompts = [[5 + (i * 31 + j * 7) % 997 for j in range(args.prompt_tokens)]
                   for i in range(rows)]
        arms = {"ours": ours, "theirs": theirs}
        if args.direct:
            arms["direct"] = lambda m, p, t: ours(m, p, t, direct_on=True)
        if unpacked is not None:
            arms["unpack"] = lambda m, p, t: ours(unpacked, p, t, direct_on=args.direct)
        got: dict[str, list] = {name: [] for name in arms}
        for r in range(args.rounds):
            order = list(arms.items())
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                got[name].append(fn(model, prompts, args.tokens)["tps"])
        res = {f"{name}_tps": statistics.median(v) for name, v in got.items()}
        for name in arms:
            if name != "theirs":
                res[f"{name}_ratio_paired"] = statistics.median(
                    a / b for a, b in zip(got[name], got["theirs"]))
        out[f"rows{rows}"] = {**res, "rounds": got}
        print(rows, json.dumps({k: v for k, v in out[f"rows{rows}"].items() if k != "rounds"}),
              flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
