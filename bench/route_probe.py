"""Where the short-attention route stalls with a float16 model on CUDA (issue 21's open
question): SmolLM2-135M as the GPU conversion stores it (4-bit, float16 activations) ran
every bench through cuDNN but did not finish its first request with the route on.

Prints as it goes, with a Python traceback every ``--watchdog`` seconds, so a stall names
its step:

1. ``ops``: the route's own steps (scores matmul, causal mask, softmax, values matmul), each
   evaluated and timed alone, at SmolLM2's head layout in float16 and bfloat16, keys as
   slices of a cache buffer;
2. ``model``: the loaded model's forward passes of 2-16 new tokens over a prefilled history,
   the route on, then off.

    python bench/route_probe.py            # the embedded SmolLM2-135M
"""

# ruff: noqa: B023  (each lambda runs at once, inside step(), within its own iteration)
from __future__ import annotations

import argparse
import faulthandler
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxbun_core.engine import attention_route as route


def step(label: str, fn: Callable[[], Any]) -> Any:
    print(f"  {label} ...", end="", flush=True)
    mx.synchronize()
    t = time.perf_counter()
    out = fn()
    mx.eval(out)
    mx.synchronize()
    print(f" {(time.perf_counter() - t) * 1e3:.2f} ms", flush=True)
    return out


def ops(hq: int, hk: int, d: int, dtype: Any) -> None:
    for s in (300, 1000):
        cap = (s // 256 + 2) * 256
        kb = mx.random.normal((1, hk, cap, d)).astype(dtype)
        vb = mx.random.normal((1, hk, cap, d)).astype(dtype)
        k, v = kb[:, :, :s], vb[:, :, :s]
        for n in (2, 8, 64):
            q = mx.random.normal((1, hq, n, d)).astype(dtype)
            mx.eval(q, kb, vb)
            print(f"ops {dtype} keys {s} query {n}", flush=True)
            g = hq // hk
            scores = step("scores", lambda: (q * d ** -0.5).reshape(1, hk, g * n, d)
                          @ k.swapaxes(-1, -2))
            keep = mx.arange(s - n, s)[:, None] >= mx.arange(s)[None]
            masked = step("mask", lambda: mx.where(
                keep, scores.reshape(1, hk, g, n, s), mx.finfo(scores.dtype).min
            ).reshape(1, hk, g * n, s))
            w = step("softmax", lambda: mx.softmax(masked, axis=-1, precise=True))
            step("values", lambda: w @ v)
            step("route.attention", lambda: route.attention(q, k, v, scale=d ** -0.5,
                                                            mask="causal"))
            fused = route._fused or mx.fast.scaled_dot_product_attention
            step("fused", lambda: fused(q, k, v, scale=d ** -0.5, mask="causal"))


def model_forwards(model: Any, tokens: list[int], modes: list[str]) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    for mode in modes:
        route.uninstall()
        route.install(mode)
        print(f"model, route {mode} (installed: {route._fused is not None})", flush=True)
        cache = make_prompt_cache(model)
        step(f"prefill {len(tokens)}", lambda: model(mx.array([tokens]), cache=cache))
        for i, n in enumerate((2, 4, 8, 16, 3, 5)):
            new = mx.array([tokens[i * 16:i * 16 + n]])
            step(f"forward {n}", lambda: model(new, cache=cache))
    route.uninstall()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="checkpoint path (default: the embedded SmolLM2-135M)")
    p.add_argument("--watchdog", type=float, default=30.0)
    p.add_argument("--modes", nargs="+", default=["on", "off"], help="model part's order")
    p.add_argument("--no-ops", action="store_true", help="skip the ops part")
    args = p.parse_args()
    faulthandler.dump_traceback_later(args.watchdog, repeat=True)
    print("mlx", mx.__version__, mx.default_device(), flush=True)
    from mlxbun_core.engine.core import Engine

    engine = Engine.load(args.model, progress=False, batch=1, prompt_cache_bytes=0)
    try:
        lm = engine.model
        cfg = lm.config
        hq, hk = cfg["num_attention_heads"], cfg.get("num_key_value_heads", 1)
        d = cfg.get("head_dim") or cfg["hidden_size"] // hq
        dtypes = {str(v.dtype) for _, v in _leaves(lm.model.parameters())}
        print(f"model {lm.id}: heads {hq}/{hk}, head dim {d}, weight dtypes {sorted(dtypes)}",
              flush=True)
        run = engine.worker.run_sync
        for dtype in () if args.no_ops else (mx.float16, mx.bfloat16):
            run(lambda dt=dtype: ops(hq, hk, d, dt))
        text = "def total(items):\n    return sum(i.price * i.qty for i in items)\n" * 20
        tokens = lm.tokenizer.encode(text)[:300]
        run(lambda: model_forwards(lm.model, tokens, args.modes))
        print("done", flush=True)
    finally:
        faulthandler.cancel_dump_traceback_later()
        engine.close()


def _leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in _leaves(v, f"{prefix}{k}.")]
    if isinstance(tree, list):
        return [x for i, v in enumerate(tree) for x in _leaves(v, f"{prefix}{i}.")]
    return [(prefix, tree)]


if __name__ == "__main__":
    main()
