"""Where the flash kernel's NaN comes from (one device call): the first check case run
through variants of the kernel's source, each reporting which outputs hold NaN.

The CPU emulation (``kernel_emulate.py``, also with shared memory filled with NaN) is exact
on every case while the H100 gave NaN on all of them with no memory error under
compute-sanitizer, so the variants each change one thing the emulation treats differently:
the fast exponential, the infinities, loops kept rolled, the 16-byte loads, one split or
many.

    python bench/flash_debug.py [--out flash_debug.json] [--source generated.cu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx

from mlxbun_core.engine.batch import attention, flash

BASE = flash._SOURCE
VARIANTS = {
    "as_is": lambda s: s,
    "expf": lambda s: s.replace("__expf", "expf"),
    "finite_inf": lambda s: s.replace("-INFINITY", "-1e30f"),
    "expf_finite": lambda s: s.replace("__expf", "expf").replace("-INFINITY", "-1e30f"),
    "unroll1": lambda s: s.replace("for (", "_Pragma(\"unroll 1\") for ("),
}


def nan_report(a: mx.array) -> dict:
    a = a.astype(mx.float32)
    bad = mx.isnan(a) | mx.isinf(a)
    return {"bad": int(mx.sum(bad).item()), "size": a.size,
            "min": float(mx.min(mx.where(bad, 0, a)).item()),
            "max": float(mx.max(mx.where(bad, 0, a)).item())}


def run(name: str, single: bool, vecload: bool, case: tuple) -> dict:
    from paged_kernel import setup

    hq, hkv, dim, width, dtype = case
    flash._SOURCE = VARIANTS[name](BASE)
    flash._kernels.clear()
    flash.VECLOAD = vecload
    q, store, view = setup(3, [5, 70, 300], hq, hkv, dim, width, dtype)
    ref = attention.paged_reference(q, store, view, None, dim ** -0.5).astype(mx.float32)
    mx.eval(ref)
    keys = store.keys
    assert keys is not None
    tile = flash.tile_for(dim, keys.dtype.size, hq // hkv)
    keys_n = int(view.starts.max()) + width
    splits, chunk = (1, -(-keys_n // tile) * tile) if single else \
        flash.splits_for(3, hkv, width, keys_n, tile)
    consts = flash.consts_of(view, (width, view.blocks.shape[1], 0, hkv, splits, chunk),
                             dim ** -0.5)
    part = (3, hq, width, splits)
    outs = flash._kernel(keys.dtype, single)(
        inputs=[q.astype(keys.dtype), keys, store.values, view.blocks, view.offset, *consts],
        template=[("T", keys.dtype), ("O", keys.dtype if single else mx.float32), ("D", dim),
                  ("R", hq // hkv), ("BS", store.pool.block_size), ("TILE", tile),
                  ("NT", flash.NT), ("SINGLE", single), ("VECLOAD", vecload)],
        grid=(3 * hkv * width * splits * flash.NT, 1, 1), threadgroup=(flash.NT, 1, 1),
        output_shapes=[(3, hq, width, dim), (1,), (1,)] if single
        else [(*part, dim), part, part],
        output_dtypes=[keys.dtype, mx.float32, mx.float32] if single
        else [mx.float32, mx.float32, mx.float32],
        init_value=0.0, verbose=(name == "as_is" and not single and vecload and dim == 64))
    mx.eval(outs)
    out = {"variant": name, "single": single, "vecload": vecload, "case": str(case),
           "splits": splits, "chunk": chunk, "tile": tile, "acc": nan_report(outs[0])}
    if single:
        got = outs[0].astype(mx.float32)
    else:
        out["m"], out["l"] = nan_report(outs[1]), nan_report(outs[2])
        out["m_row0"] = [round(x, 3) for x in outs[1][0, 0, 0].tolist()]
        out["l_row0"] = [round(x, 3) for x in outs[2][0, 0, 0].tolist()]
        got = flash.combine(*outs)
    out["max_err"] = float(mx.max(mx.abs(got - ref)).item())
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="flash_debug.json")
    args = p.parse_args()
    results = []
    cases = [(8, 8, 64, 1, mx.bfloat16), (32, 8, 128, 1, mx.bfloat16)]
    for case in cases:
        for name in VARIANTS:
            for single in (False, True):
                for vecload in (True, False):
                    try:
                        r = run(name, single, vecload, case)
                    except Exception as exc:  # a variant that does not build says so
                        r = {"variant": name, "single": single, "vecload": vecload,
                             "case": str(case), "error": str(exc)[:300]}
                    print(json.dumps(r), flush=True)
                    results.append(r)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
