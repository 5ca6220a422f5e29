"""SmolLM2-135M (the embedded default, float32) through mlx-lm: prefill and decode tok/s with
MLX's CPU matrix products on OpenBLAS (``MLXBUN_BLAS=auto``) against the reference BLAS MLX
ships (``MLXBUN_BLAS=reference``). A fresh process per measurement, the two alternating
A B / B A for ``--rounds`` rounds in one run; medians and per-round numbers are printed.

    .venv/bin/python bench/blas_smollm2.py [--rounds 5] [--prompt-tokens 256] [--gen 32]
        [--out bench/results/blas_smollm2_cpu.json]

Uses (and on first use converts) the embedded default under ``$MLXBUN_HOME``. CPU only:
on macOS and CUDA the BLAS is not in the path and both variants measure the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("auto", "reference")  # MLXBUN_BLAS values; "auto@1": auto with 1 OpenBLAS thread


def child(path: str, prompt_tokens: int, gen: int) -> dict:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    import mlxbun_core  # noqa: F401  (routes the BLAS when mlx.core loads)
    from mlxbun_core import blas

    model, tok = load(path)
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly "
             "judge boxing matches near the old mill ").split()
    prompt = tok.encode(" ".join(words[i % len(words)] for i in range(prompt_tokens * 2)))
    prompt = prompt[:prompt_tokens]
    ban_eos = make_logits_processors({t: -1e9 for t in tok.eos_token_ids})  # full-length runs
    last = None
    t0 = time.perf_counter()
    responses = stream_generate(model, tok, prompt, max_tokens=gen, logits_processors=ban_eos)
    for last in responses:  # noqa: B007 (the last response carries the run's totals)
        pass
    mx.synchronize()
    return {"blas": blas.state().active, "library": blas.state().library,
            "prompt_tokens": last.prompt_tokens, "prefill_tps": round(last.prompt_tps, 2),
            "generation_tokens": last.generation_tokens,
            "decode_tps": round(last.generation_tps, 2),
            "wall_s": round(time.perf_counter() - t0, 2)}


def run_variant(variant: str, path: str, args) -> dict:
    choice, _, threads = variant.partition("@")
    env = {**os.environ, "MLXBUN_BLAS": choice, "MLXBUN_BLAS_WARNED": "1"}
    if threads:
        env["MLXBUN_BLAS_THREADS"] = threads
    out = subprocess.run([sys.executable, __file__, "--child", path, "--prompt-tokens",
                          str(args.prompt_tokens), "--gen", str(args.gen)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated MLXBUN_BLAS values, the first against the others")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.prompt_tokens, args.gen)))
        return
    from mlxbun_core.models.resolve import resolve_model

    path = str(resolve_model(None, progress=True).path)
    variants = args.variants.split(",")
    rows = []
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            row = {"round": r, "variant": v, **run_variant(v, path, args)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for v in variants:
        mine = [x for x in rows if x["variant"] == v]
        summary[v] = {k: statistics.median(x[k] for x in mine)
                      for k in ("prefill_tps", "decode_tps")}
    base = summary[variants[-1]]
    summary["speedup_vs_" + variants[-1]] = {
        v: {k: round(summary[v][k] / base[k], 2) for k in base} for v in variants[:-1]}
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": path, "args": vars(args), "rows": rows, "summary": summary}, f,
                      indent=2)


if __name__ == "__main__":
    main()
