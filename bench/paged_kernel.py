"""The paged-attention kernel (``engine/batch/attention.py``) against its plain-ops
reference and against MLX's attention over a dense padded cache, on the device.

Checks the kernel's output on several shapes (query heads per KV head, head dims,
windows, verify widths, ragged rows), then times one layer's attention at a decode
batch: the kernel, the gathered portable path, and MLX's fused attention over a dense
cache as long as the longest row (what mlx-lm's ``BatchKVCache`` hands it).

    python bench/paged_kernel.py --out bench/results/paged_kernel_h100.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree

import mlx.core as mx
import numpy as np

from mlxbun_core.engine.batch import attention, flash
from mlxbun_core.engine.batch.attention import paged_attention
from mlxbun_core.engine.batch.pool import BlockPool, BlockTable
from mlxbun_core.engine.batch.storage import LayerStore
from mlxbun_core.engine.batch.view import Window


def setup(rows, lengths, hq, hkv, dim, width, dtype, seed=0):
    rng = np.random.default_rng(seed)
    bs = 16
    pool = BlockPool(bs, sum(-(-(n + width) // bs) for n in lengths) + 4)
    store = LayerStore(pool)
    tables = []
    for n in lengths:
        t = BlockTable(pool)
        t.reserve(n + width)
        t.length = n
        tables.append(t)
    # fill every row's positions [0, n + width) with random keys/values
    for t in tables:
        t.length = 0
    fill = Window.over(tables, [n + width for n in lengths], max(lengths) + width)
    k = mx.array(rng.standard_normal((rows, hkv, max(lengths) + width, dim)), dtype=dtype)
    v = mx.array(rng.standard_normal((rows, hkv, max(lengths) + width, dim)), dtype=dtype)
    store.write(fill.write_slots, k, v)
    for t, n in zip(tables, lengths):
        t.length = n
    view = Window.over(tables, [width] * rows, width)
    q = mx.array(rng.standard_normal((rows, hq, width, dim)), dtype=dtype)
    mx.eval(store.keys, store.values, q)
    return q, store, view


def check(out: dict) -> None:
    """Each case on its own, the reference evaluated before the kernel, so a fault names
    its case (run with CUDA_LAUNCH_BLOCKING=1 to have it raised at the launch)."""
    cases = []
    out["check"] = cases
    for hq, hkv, dim in ((8, 8, 64), (32, 8, 128), (16, 2, 128), (8, 1, 256)):
        for width in (1, 4):
            for window in (None, 37):
                for dtype in (mx.bfloat16, mx.float16):
                    case = {"hq": hq, "hkv": hkv, "dim": dim, "width": width,
                            "window": window, "dtype": str(dtype)}
                    print("case", case, flush=True)
                    q, store, view = setup(3, [5, 70, 300], hq, hkv, dim, width, dtype)
                    b = paged_attention(q, store, view, window, dim ** -0.5, False)
                    mx.eval(b)
                    a = paged_attention(q, store, view, window, dim ** -0.5, True)
                    mx.eval(a)
                    case["max_err"] = float(mx.max(mx.abs(a.astype(mx.float32)
                                                          - b.astype(mx.float32))))
                    cases.append(case)
    out["check_ok"] = all(c["max_err"] < 2e-2 for c in cases)
    print("kernel check:", "ok" if out["check_ok"] else "FAIL",
          max(c["max_err"] for c in cases), flush=True)


def timed(fn, n=50):
    for _ in range(5):
        mx.eval(fn())
    mx.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        mx.eval(fn())
    mx.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def speed(out: dict, rows: int, length: int) -> None:
    hq, hkv, dim = 32, 8, 128
    lengths = [length - (i * 97) % (length // 2) for i in range(rows)]  # ragged rows
    q, store, view = setup(rows, lengths, hq, hkv, dim, 1, mx.bfloat16)
    longest = max(lengths) + 1
    kd = mx.random.normal((rows, hkv, longest, dim)).astype(mx.bfloat16)
    vd = mx.random.normal((rows, hkv, longest, dim)).astype(mx.bfloat16)
    mx.eval(kd, vd)
    bs = store.pool.block_size

    def fancy():  # the old gather: fancy indexing of the 5-d view
        k = store.keys.reshape(-1, bs, hkv, dim)[view.blocks]
        return k.reshape(rows, -1, hkv, dim).transpose(0, 2, 1, 3)

    res = {
        "kernel_us": timed(lambda: paged_attention(q, store, view, None, dim ** -0.5, True)),
        "gather_only_us": timed(lambda: store.gather(view.blocks)[0]),
        "gather_fancy_us": timed(fancy),
        "gathered_us": timed(lambda: mx.fast.scaled_dot_product_attention(
            q, *store.gather(view.blocks), scale=dim ** -0.5, mask=view.mask())),
        "dense_us": timed(lambda: mx.fast.scaled_dot_product_attention(
            q, kd, vd, scale=dim ** -0.5)),
    }
    kv_bytes = sum(lengths) * hkv * dim * 2 * 2
    res["kernel_gbs"] = kv_bytes / res["kernel_us"] / 1e3
    out[f"speed_rows{rows}_len{length}"] = res
    print(rows, length, json.dumps(res), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--scalar-loads", action="store_true",
                   help="the flash kernel copies keys and values to shared memory one by one")
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--flash", action="store_true", help="the flash kernel (flash.py)")
    args = p.parse_args()
    if args.flash:
        attention.KERNEL = "flash"
    if args.scalar_loads:
        flash.VECLOAD = False
    out: dict = {"device": str(mx.default_device()), "kernel": attention.KERNEL,
                 "vector_loads": flash.VECLOAD}
    check(out)
    if args.check_only:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
        return
    for rows, length in ((1, 4096), (8, 640), (32, 640), (32, 4096)):
        speed(out, rows, length)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
