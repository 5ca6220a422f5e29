"""Where a quantized matmul stops being a weight read: the layer shapes of an 8B model at
1..128 rows, three ways, same process.

- ``qmm``: ``mx.quantized_matmul`` over the packed weights (``nn.QuantizedLinear``);
- ``unpack``: ``mx.dequantize`` of the layer then a dense matmul
  (``engine/wide_quant.py``'s wide path);
- ``dense``: the same matmul over bf16 weights (what an unquantized model pays).

Per shape and row count: microseconds per call (median of ``--rounds``), and the row
count from which ``unpack`` beats ``qmm`` (the engine's ``CUDA_MIN_ROWS``).

    python bench/quant_matmul.py --out bench/results/quant_matmul_h100.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import mlx.core as mx

from paged_kernel import timed  # this folder

# Qwen3-8B: q/o 4096x4096, k/v 4096->1024, gate/up 4096->12288, down 12288->4096, lm_head
SHAPES = {"qo": (4096, 4096), "kv": (4096, 1024), "gate_up": (4096, 12288),
          "down": (12288, 4096), "lm_head": (4096, 151936)}
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def arms_for(x, w, packed, group_size: int, bits: int) -> dict:
    wq, scales, biases = packed
    return {
        "qmm": lambda: mx.quantized_matmul(x, wq, scales, biases, transpose=True,
                                           group_size=group_size, bits=bits),
        "unpack": lambda: x @ mx.dequantize(wq, scales, biases, group_size=group_size,
                                            bits=bits, dtype=mx.bfloat16).T,
        "dense": lambda: x @ w.T,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out")
    args = p.parse_args()
    out: dict = {"device": str(mx.default_device()), "args": vars(args), "shapes": {}}
    for name, (din, dout) in SHAPES.items():
        w = (mx.random.normal((dout, din)) * 0.02).astype(mx.bfloat16)
        wq, scales, biases = mx.quantize(w, group_size=args.group_size, bits=args.bits)
        mx.eval(w, wq, scales, biases)
        res = {}
        for rows in ROWS:
            x = mx.random.normal((rows, din)).astype(mx.bfloat16)
            arms = arms_for(x, w, (wq, scales, biases), args.group_size, args.bits)
            got = {k: [] for k in arms}
            for r in range(args.rounds):
                for k, fn in (list(arms.items()) if r % 2 == 0 else list(arms.items())[::-1]):
                    got[k].append(timed(fn, args.calls))
            res[rows] = {f"{k}_us": round(statistics.median(v), 1) for k, v in got.items()}
            res[rows]["unpack_vs_qmm"] = round(statistics.median(
                a / b for a, b in zip(got["unpack"], got["qmm"])), 3)
        wins = [r for r in ROWS if res[r]["unpack_vs_qmm"] < 1.0]
        out["shapes"][name] = {"in": din, "out": dout, "rows": res,
                               "unpack_wins_from": wins[0] if wins else None}
        print(name, json.dumps(out["shapes"][name]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
