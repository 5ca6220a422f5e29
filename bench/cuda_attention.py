"""What a short multi-token forward pays for attention on CUDA, and what the plain-ops
route (``mlxbun_core.engine.attention_route``) saves.

1. ``ops``: one attention call (32 query heads, 8 KV heads, head dim 128, bf16; keys and
   values as slices of a longer cache buffer, as mlx-lm hands them over) at query lengths
   2-256 and key lengths 1k-32k: MLX's fused function the first time at that shape (cold),
   the second time (warm), and the plain-ops route.
2. ``model``: forwards of a few new tokens over a growing cached history on an 8B-shaped
   checkpoint (every call a new key length, as in serving), fused vs routed, plus the
   greedy token each produced.
3. ``decode``: per-step times of 600 single-token decode steps past a 4k history, to see
   whether the fused decode pays a graph at every cache growth (every 256 tokens).

    python bench/cuda_attention.py --model /tmp/bench-qwen3-8b-bfloat16 --out r.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx

from mlxbun_core.engine import attention_route as route


def timed(fn, *args, **kw) -> tuple[float, mx.array]:
    mx.synchronize()
    t = time.perf_counter()
    out = fn(*args, **kw)
    mx.eval(out)
    mx.synchronize()
    return (time.perf_counter() - t) * 1e3, out


def ops(rows: list[dict]) -> None:
    hq, hk, d = 32, 8, 128
    for s in (1024, 4096, 16384, 32768):
        cap = (s // 256 + 2) * 256
        kb = mx.random.normal((1, hk, cap, d)).astype(mx.bfloat16)
        vb = mx.random.normal((1, hk, cap, d)).astype(mx.bfloat16)
        mx.eval(kb, vb)
        k, v = kb[:, :, :s], vb[:, :, :s]
        for n in (2, 4, 8, 16, 64, 150, 256):
            q = mx.random.normal((1, hq, n, d)).astype(mx.bfloat16)
            mx.eval(q)
            fused = route._fused or mx.fast.scaled_dot_product_attention
            kw = {"scale": d ** -0.5, "mask": "causal"}
            cold, a = timed(fused, q, k, v, **kw)
            warm, _ = timed(fused, q, k, v, **kw)
            plain, b = timed(route.attention, q, k, v, **kw)
            plain2, _ = timed(route.attention, q, k, v, **kw)
            err = float(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max())
            rows.append({"part": "ops", "keys": s, "query": n, "fused_cold_ms": cold,
                         "fused_warm_ms": warm, "plain_ms": min(plain, plain2),
                         "max_abs_diff": err})
            print(f"ops  keys {s:6d} query {n:4d}  fused cold {cold:7.2f} warm {warm:6.2f}"
                  f"  plain {min(plain, plain2):6.2f} ms  |diff| {err:.3g}", flush=True)


def model_part(path: str, rows: list[dict]) -> None:
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(path)
    import random

    rng = random.Random(0)
    step = lambda toks, cache: model(toks, cache=cache)[:, -1, :].argmax(-1)  # noqa: E731
    # each round starts at its own history length: every forward meets a new key length,
    # as in serving (a repeated length would find cuDNN's graph cached)
    for i, arm in enumerate(("fused", "routed", "fused", "routed")):
        hist = [rng.randrange(100, 1000) for _ in range(4096 + 61 * i)]
        if arm == "routed":
            route.install("on")
        else:
            route.uninstall()
        cache = make_prompt_cache(model)
        for i in range(0, len(hist), 2048):
            model(mx.array(hist[i:i + 2048])[None], cache=cache)
            mx.eval([c.state for c in cache])
        for n in (150, 150, 37, 37, 8, 8, 8, 4, 4, 2):
            toks = mx.array([rng.randrange(100, 1000) for _ in range(n)])[None]
            ms, out = timed(step, toks, cache)
            rows.append({"part": "model", "arm": arm, "query": n, "ms": ms,
                         "offset": cache[0].offset})
            print(f"model {arm:6s} n={n:4d} at {cache[0].offset:5d}: {ms:7.1f} ms", flush=True)
    route.uninstall()
    # decode: per-step times past a 4k history (a fresh cache, fused kernels)
    cache = make_prompt_cache(model)
    for i in range(0, len(hist), 2048):
        model(mx.array(hist[i:i + 2048])[None], cache=cache)
        mx.eval([c.state for c in cache])
    tok = mx.array([[5]])
    steps = []
    for _ in range(600):
        ms, out = timed(step, tok, cache)
        tok = out[None]
        steps.append((cache[0].offset, ms))
    times = [m for _, m in steps]
    med = statistics.median(times)
    spikes = [(o, round(m, 1)) for o, m in steps if m > 3 * med]
    rows.append({"part": "decode", "median_ms": med, "max_ms": max(times), "spikes": spikes})
    print(f"decode median {med:.2f} ms, max {max(times):.1f}; steps over 3x median "
          f"(offset, ms): {spikes}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--parts", nargs="*", default=["ops", "model"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows: list[dict] = []
    if "ops" in args.parts:
        ops(rows)
    if "model" in args.parts and args.model:
        model_part(args.model, rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": str(mx.default_device()), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
