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
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree

# MLX runs float32 matrix products of more than one row as TF32 on CUDA unless told not to
# (MLX_ENABLE_TF32, default 1; a one-row product is a GEMV and stays float32). The plain-ops
# reference's products have width x (query heads per KV head) rows, so at width 4 it was
# itself ~5e-4 off (a bf16 or fp16 rounding flip: the "1 ulp at width 4" of both kernels).
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import mlx.core as mx
import numpy as np

from mlxbun_core.engine.batch import attention, flash
from mlxbun_core.engine.batch.attention import paged_attention, paged_reference
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


# A kernel is right when each output is its dtype's rounding of the float64 attention, give
# or take the kernel's float32 sums: within one unit in the last place of the dtype. EPS is
# that unit at 1.0 (bf16 keeps 8 significant bits, fp16 11): the bound is EPS * |reference|,
# twice a rounding's half unit, floored at FLOOR for outputs near zero (whose float32 error is
# absolute, ~1e-6). A 1-ulp difference is accumulation order; two or more is a wrong kernel.
# float32 (the CPU emulation's stand-in for fp16) is not rounded after the sums, so its
# bound is the sums' own error (~1e-6 absolute near zero), with room: 2**-12.
EPS = {mx.bfloat16: 2.0 ** -7, mx.float16: 2.0 ** -10, mx.float32: 2.0 ** -12}
FLOOR = 2.0 ** -6


def host_reference(q, store, view, window, scale) -> np.ndarray:
    """The attention in float64 numpy on the host, from the pool's slots and the block
    tables: nothing of it runs on the device (not the gather, the mask or a matmul)."""
    keys = np.array(store.keys.astype(mx.float32), dtype=np.float64)
    values = np.array(store.values.astype(mx.float32), dtype=np.float64)
    qs = np.array(q.astype(mx.float32), dtype=np.float64) * scale
    blocks, bs = np.array(view.blocks), store.pool.block_size
    rows, hq, width, dim = qs.shape
    hkv = keys.shape[1]
    out = np.zeros(qs.shape)
    for b in range(rows):
        for i in range(width):
            pos = int(view.starts[b]) + i
            lo = max(0, pos - window + 1) if window else 0
            p = np.arange(lo, pos + 1)
            slots = blocks[b, p // bs] * bs + p % bs
            for h in range(hq):
                kv = h // (hq // hkv)
                s = keys[slots, kv] @ qs[b, h, i]
                w = np.exp(s - s.max())
                out[b, h, i] = w @ values[slots, kv] / w.sum()
    return out


def ulps(got: mx.array, want: np.ndarray, dtype) -> float:
    """The largest difference in units of the bound above (<= 1: right); inf for NaN."""
    g = np.array(got.astype(mx.float32), dtype=np.float64)
    if not np.isfinite(g).all():
        return float("inf")
    return float((np.abs(g - want) / (EPS[dtype] * np.maximum(np.abs(want), FLOOR))).max())


def nan_count(a: mx.array) -> int:
    return int(mx.sum(~mx.isfinite(a.astype(mx.float32))).item())


def kernel_case(case: dict, q, store, view, window, want, dtype, kernel: str) -> None:
    """One kernel on one case: its error in ulps; for flash with non-finite outputs, where
    they are: in the kernel's own partials, or made by the plain-ops combine after it."""
    attention.KERNEL = kernel
    a = paged_attention(q, store, view, window, q.shape[-1] ** -0.5, True)
    mx.eval(a)
    case[f"{kernel}_ulps"] = ulps(a, want, dtype)
    case[f"{kernel}_max_err"] = float(np.abs(np.array(a.astype(mx.float32)) - want).max())
    if kernel == "flash" and nan_count(a):
        parts = flash.flash_partials(q, store, view, window, q.shape[-1] ** -0.5)
        mx.eval(*parts)
        case["flash_nonfinite"] = {"out": nan_count(a),
                                   "partials": [nan_count(p) for p in parts]}


def check(out: dict, kernel: str) -> None:
    """Each case on its own, every result evaluated before the next, so a fault names its
    case (run with CUDA_LAUNCH_BLOCKING=1 to have it raised at the launch). The verdict is
    ``kernel``'s against the host's float64 attention; the device's plain-ops reference and,
    checking flash, the split-key kernel are measured beside it, so a NaN says whose it is."""
    cases = []
    out["check"] = cases
    kernels = [kernel] + (["splitk"] if kernel == "flash" else [])
    for hq, hkv, dim in ((8, 8, 64), (32, 8, 128), (16, 2, 128), (8, 1, 256)):
        for width in (1, 4):
            for window in (None, 37):
                for dtype in (mx.bfloat16, mx.float16):
                    case = {"hq": hq, "hkv": hkv, "dim": dim, "width": width,
                            "window": window, "dtype": str(dtype)}
                    print("case", case, flush=True)
                    q, store, view = setup(3, [5, 70, 300], hq, hkv, dim, width, dtype)
                    want = host_reference(q, store, view, window, dim ** -0.5)
                    b = paged_attention(q, store, view, window, dim ** -0.5, False)
                    mx.eval(b)
                    case["reference_ulps"] = ulps(b, want, dtype)
                    for k in kernels:
                        kernel_case(case, q, store, view, window, want, dtype, k)
                    case["max_err"] = case[f"{kernel}_max_err"]  # (the old field)
                    case["ok"] = case[f"{kernel}_ulps"] <= 1.0
                    print("  ", {k: v for k, v in case.items() if "ulps" in k or k == "ok"},
                          flush=True)
                    cases.append(case)
    attention.KERNEL = kernel
    out["check_ok"] = all(c["ok"] for c in cases)
    print("kernel check:", "ok" if out["check_ok"] else "FAIL",
          max(c[f"{kernel}_ulps"] for c in cases), "ulps at most", flush=True)


def timed(fn, n=50):
    for _ in range(5):
        mx.eval(fn())
    mx.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        mx.eval(fn())
    mx.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def decode_case(rows: int, length: int, hkv: int = 8, dim: int = 128):
    """A decode step's attention inputs, Qwen3-8B's heads (32 over ``hkv``): ragged rows
    of up to ``length`` keys in blocks, and a dense cache as long as the longest row
    (what mlx-lm's ``BatchKVCache`` hands MLX's attention)."""
    lengths = [length - (i * 97) % (length // 2) for i in range(rows)]  # ragged rows
    q, store, view = setup(rows, lengths, 32, hkv, dim, 1, mx.bfloat16)
    kd = mx.random.normal((rows, hkv, max(lengths) + 1, dim)).astype(mx.bfloat16)
    vd = mx.random.normal((rows, hkv, max(lengths) + 1, dim)).astype(mx.bfloat16)
    mx.eval(kd, vd)
    return lengths, q, store, view, kd, vd


def speed(out: dict, rows: int, length: int) -> None:
    hkv, dim = 8, 128
    lengths, q, store, view, kd, vd = decode_case(rows, length, hkv, dim)
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


def chained(fn, q, layers=36, n=10):
    """Microseconds a call inside one graph of ``layers`` calls, each on the last's
    output (a decode step's layers, as the device runs them: no sync per call)."""
    def stack():
        out = q
        for _ in range(layers):
            out = fn(out)
        return out
    return timed(stack, n) / layers


# the split-key kernel's settings as the engine ships them: each swept one is checked
# against them, and they are put back after
SHIPPED = (attention.CHUNK, attention.WARPS, attention.GROUP, attention.VEC, attention.FUSED)


def sweep(out: dict) -> None:
    """The split-key kernel at each keys-per-split, warps-per-block, keys-per-warp-step
    and load-width setting, the flash kernel and MLX's dense attention, timed within a
    graph of 36 layers' calls; first each new setting's output against the reference."""
    res: dict = {"errors": sweep_errors()}
    print("errors", json.dumps(res["errors"]), flush=True)
    for rows, length in ((1, 4096), (8, 640), (32, 640), (32, 4096)):
        res[f"rows{rows}_len{length}"] = got = sweep_shape(rows, length)
        print(rows, length, json.dumps(got), flush=True)
    out["sweep"] = res


def sweep_errors() -> dict:
    """Max abs error of each keys-per-warp-step, load-width and combine setting of the
    split-key kernel against the float32 reference, bf16, ragged rows, width 1 and 4, a
    window (keys past 256 make several splits)."""
    errs: dict = {}
    for group, vec, fused in itertools.product((1, 2, 4), (False, True), (False, True)):
        attention.GROUP, attention.VEC, attention.FUSED = group, vec, fused
        worst = 0.0
        for width, window in ((1, None), (4, None), (1, 37)):
            q, store, view = setup(5, [3, 40, 300, 17, 129], 32, 8, 128, width, mx.bfloat16)
            got = paged_attention(q, store, view, window, 0.088, True).astype(mx.float32)
            want = paged_reference(q, store, view, window, 0.088).astype(mx.float32)
            worst = max(worst, float(mx.max(mx.abs(got - want))))
        errs[f"g{group}{'_vec' if vec else ''}{'_fused' if fused else ''}"] = worst
    attention.GROUP, attention.VEC, attention.FUSED = SHIPPED[2:]
    return errs


def sweep_shape(rows: int, length: int) -> dict:
    hkv, dim = 8, 128
    scale = dim ** -0.5
    lengths, q, store, view, kd, vd = decode_case(rows, length, hkv, dim)

    def paged(x):
        return paged_attention(x, store, view, None, scale, True)

    got: dict = {"dense_us": chained(
        lambda x: mx.fast.scaled_dot_product_attention(x, kd, vd, scale=scale), q)}
    want = paged(q).astype(mx.float32)  # the shipped setting: each other one's against it
    tol = 0.03 * max(1.0, float(mx.max(mx.abs(want))))  # a few bf16 ulps; a bug is O(1)
    diffs: dict = {}
    for chunk, warps, group, vec, fused in itertools.product(
            (64, 128, 256), (4, 8), (1, 2, 4), (False, True), (False, True)):
        attention.KERNEL, attention.CHUNK, attention.WARPS = "splitk", chunk, warps
        attention.GROUP, attention.VEC, attention.FUSED = group, vec, fused
        name = f"splitk_c{chunk}_w{warps}_g{group}{'_vec' if vec else ''}" \
               f"{'_fused' if fused else ''}_us"
        diffs[name] = float(mx.max(mx.abs(paged(q).astype(mx.float32) - want)))
        got[name] = chained(paged, q)
    got["diff_from_default"] = diffs
    got["diff_tolerance"] = tol
    attention.CHUNK, attention.WARPS, attention.GROUP, attention.VEC, attention.FUSED = SHIPPED
    attention.KERNEL = "flash"
    try:
        got["flash_us"] = chained(paged, q)
    except Exception as exc:  # (the flash kernel is not the default: its failure is data)
        got["flash_error"] = str(exc)[:200]
    attention.KERNEL = "splitk"
    best = min((v, k) for k, v in got.items() if k.startswith("splitk") and diffs[k] <= tol)
    got["best_splitk"] = best[1]
    got["best_splitk_gbs"] = sum(lengths) * hkv * dim * 2 * 2 / best[0] / 1e3
    return got


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--scalar-loads", action="store_true",
                   help="the flash kernel copies keys and values to shared memory one by one")
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--sweep", action="store_true",
                   help="time the split-key kernel's settings within a 36-layer graph only")
    p.add_argument("--flash", action="store_true", help="the flash kernel (flash.py)")
    args = p.parse_args()
    if args.flash:
        attention.KERNEL = "flash"
    if args.scalar_loads:
        flash.VECLOAD = False
    out: dict = {"device": str(mx.default_device()), "kernel": attention.KERNEL,
                 "vector_loads": flash.VECLOAD, "mlx": mx.__version__,
                 "tf32": os.environ["MLX_ENABLE_TF32"]}
    if args.sweep:
        sweep(out)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
        return
    check(out, attention.KERNEL)
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
