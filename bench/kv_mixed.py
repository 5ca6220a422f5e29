"""Mixed-precision and rotated KV on SmolLM2-135M (float32, the embedded default): KV
bytes per token and single-stream decode tok/s for ``--kv-quant off | 8 | 4 | config |
turbo:k4v4`` (issue #37).

``config`` is an optiq-style kv_config.json for this model: layer 0 (the layer optiq
finds most sensitive) at 8 bits, the other 29 at 4. Each scheme's cache is prefilled once
with a ``--context``-token prompt through the quantizing model wrapper the serial lane
uses; the bytes are what the caches hold for those positions (``state`` cut to the
offset). Every round then decodes ``--tokens`` greedy tokens from each scheme in turn
(schemes interleaved so all see the same machine load) and trims them off again; round
one warms up, the median of the rest is reported.

    python bench/kv_mixed.py --context 512 --tokens 24 --rounds 4 \\
        --out bench/results/kv_mixed_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx

SCHEMES = ("off", "8", "4", "config", "turbo:k4v4")


def held_bytes(cache: list) -> int:
    """Bytes the caches hold for their positions (grown buffers cut to the offset)."""
    total = 0
    for c in cache:
        n, full = c.offset, (c.keys[0] if isinstance(c.keys, (tuple, list)) else c.keys)
        parts = [*(c.keys if isinstance(c.keys, (tuple, list)) else [c.keys]),
                 *(c.values if isinstance(c.values, (tuple, list)) else [c.values])]
        total += sum(int(p.nbytes) * n // full.shape[2] for p in parts)
    return total


def prefill(model, tokens: list, step: int = 256) -> list:
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i:i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def decode(model, cache: list, first: int, n: int) -> float:
    """Greedy tokens/s of ``n`` tokens (synchronous, one forward per token), trimmed off."""
    tok = mx.array([[first]])
    start = time.perf_counter()
    for _ in range(n):
        logits = model(tok, cache=cache)
        tok = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
        mx.eval(tok)
    took = time.perf_counter() - start
    for c in cache:
        c.trim(n)
    return n / took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from mlx_lm import load

    from mlxbun_core import kvquant
    from mlxbun_core.models.resolve import resolve_model

    path = str(resolve_model(None, progress=True).path)
    model, tok = load(path)
    layers = len(model.layers)
    cfg = Path(tempfile.mkdtemp()) / "kv_config.json"
    cfg.write_text(json.dumps([{"layer_idx": 0, "bits": 8},
                               {"layers": f"1-{layers - 1}", "bits": 4}]))
    text = "The history of the city begins with a small settlement by the river. " * 200
    prompt = tok.encode(text)[:args.context]
    caches, models, rows = {}, {}, {}
    for s in SCHEMES:
        scheme = kvquant.parse(f"config:{cfg}" if s == "config" else s)
        models[s] = kvquant.quantizing(model, scheme)
        caches[s] = prefill(models[s], prompt)
        rows[s] = {"kv_bytes_per_token": held_bytes(caches[s]) / len(prompt),
                   "cache_kinds": sorted({type(c).__name__ for c in caches[s]}), "tps": []}
    for r in range(args.rounds):
        for s in SCHEMES:
            tps = decode(models[s], caches[s], prompt[-1], args.tokens)
            if r:
                rows[s]["tps"].append(round(tps, 2))
        print(f"round {r}: " + ", ".join(f"{s} {rows[s]['tps'][-1] if r else '-'}"
                                        for s in SCHEMES), flush=True)
    base = rows["off"]
    for s in SCHEMES:
        row = rows[s]
        row["decode_tps_median"] = statistics.median(row["tps"])
        row["bytes_vs_off"] = round(row["kv_bytes_per_token"] / base["kv_bytes_per_token"], 4)
        row["decode_vs_off"] = round(row["decode_tps_median"] / statistics.median(base["tps"]), 3)
        print(f"{s:>11}: {row['kv_bytes_per_token']:9.0f} B/token ({row['bytes_vs_off']}x), "
              f"decode {row['decode_tps_median']:.2f} tok/s ({row['decode_vs_off']}x)")
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"model": path, "device": str(mx.default_device()), "args": vars(args),
             "config": json.loads(cfg.read_text()), "schemes": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
