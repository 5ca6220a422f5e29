"""The decode step's ways (``engine/batch/tune.py``) timed in one process, same run: lean,
lean with gate and up fused, and mlx-lm's call, for a batch and for a lone stream,
alternating over ``--rounds`` rounds, with the timing a server's start-up does but
longer prompts and more steps. What the engine would choose is printed beside it.

    python bench/decode_ways.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 32 \\
        --prompt-tokens 512 --rounds 5 --steps 16 --out $OUT/decode_ways.json
    python bench/decode_ways.py --layers 36 --hidden 64      # this CPU, a deep narrow llama
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this tree
sys.path.insert(0, HERE)

import mlx.core as mx  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out")
    args = ap.parse_args()
    from mlx_lm import load

    from host_overhead import checkpoint
    from mlxbun_core.engine.batch import Batch, direct, lean, pool_for, tune
    from mlxbun_core.engine.batch.layout import layout

    tune.PROMPT, tune.ROUNDS, tune.STEPS = args.prompt_tokens, args.rounds, args.steps
    model, _ = load(args.model or checkpoint(args.layers, args.hidden))
    batch = Batch(model, layout(model), pool_for(layout(model), None))
    direct.probe(batch)
    if not lean.probe(batch) or not isinstance(batch.lean, lean.LeanDecode):
        sys.exit("this model has no lean step")
    t = time.perf_counter()
    fusable = tune.fusable(batch, batch.lean)
    ways = ["lean", "model"] + (["fused"] if fusable else [])
    rows_ms = tune.time_ways(batch, ways, args.rows)
    t_rows = time.perf_counter() - t
    t = time.perf_counter()
    solo = lean.for_solo(model)
    solo_ms = tune.time_solo(model, solo) if solo is not None else {}
    t_solo = time.perf_counter() - t
    res = {"args": vars(args), "device": str(mx.default_device()), "direct": batch.direct,
           "rows_ms": rows_ms, "rows_pick": tune.pick(rows_ms), "rows_s": round(t_rows, 2),
           "solo_ms": solo_ms, "solo_pick": tune.pick(solo_ms) if solo_ms else None,
           "solo_s": round(t_solo, 2),
           "ratios_to_lean": {w: round(v / rows_ms["lean"], 4) for w, v in rows_ms.items()}}
    batch.close()
    print(json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
