"""KV quantization (``--kv-quant off|8|4``): bytes per token, max safe context, decode tok/s.

One process, one random-weight llama-shaped checkpoint (the body is real size; the vocab is
a small test tokenizer's). For each scheme:

  - KV bytes per token (``library.fit``, what ``/fit`` and admission use) and the bytes the
    cache really holds after the prefill (``nbytes``), which must agree;
  - ``max_safe_context`` on this machine and under each ``--budget-gb`` (what a smaller
    machine would admit);
  - single-stream decode tok/s at each ``--contexts`` length: the serial lane's loop
    (mlx-lm's ``generate_step`` over our quantizing model wrapper, the same pass the solo
    path runs), greedy, ``--tokens`` tokens after a prompt of that length;
  - batched decode: ``--rows`` rows of ``--batch-context`` tokens on the engine's own batch
    (``engine/batch/``: quantized blocks in the block pool under a scheme), one batch per
    scheme, their decode steps interleaved (off, 8, 4, off, ...) so every scheme sees the
    same machine load: each step timed to its sampled tokens (median and quartiles, ms),
    and the bytes a token takes in the pool's blocks.

Caches are prefilled once per scheme and length, then every round decodes ``--tokens``
tokens from each (schemes alternate within a round) and trims them off again, so all
schemes see the same load. The first round is a warm-up; the median of the rest is reported.

    python bench/kv_quant.py --shape small --contexts 2048 8192 --tokens 32 --rounds 3  # CPU
    python bench/kv_quant.py --shape 8b --contexts 4096 32768 --tokens 128 --rounds 4 \\
        --out bench/results/kv_quant_h200.json                                        # H200
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import mlx.core as mx

SHAPES = {  # llama-style bodies, head_dim 64/128 so the group of 64 divides them
    "tiny": {"head_dim": 64},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}
SCHEMES = ("off", "8", "4")


def prefill(model, tokens: list, step: int) -> list:
    """A fresh cache holding ``tokens``, filled in chunks as the lanes fill it."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i:i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])
    mx.clear_cache()
    return cache


def decode_tps(model, cache: list, first: int, n: int, ban: list) -> float:
    """Greedy ``n`` tokens from ``cache`` with mlx-lm's loop; tok/s after the first token.
    The tokens are trimmed off afterwards, so the cache is reused by the next round."""
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import trim_prompt_cache
    from mlx_lm.sample_utils import make_logits_processors

    procs = make_logits_processors(logit_bias={t: -1e9 for t in ban})  # fixed-length runs
    before, t0, count = cache[0].offset, None, 0
    for count, _ in enumerate(generate_step(mx.array([first]), model, max_tokens=n,
                                            prompt_cache=cache, logits_processors=procs)):
        if count == 0:
            t0 = time.perf_counter()
    elapsed = time.perf_counter() - t0
    trim_prompt_cache(cache, cache[0].offset - before)
    return count / elapsed


def pool_steps(model, schemes: dict, prompts: list, steps: int, chunk: int) -> dict:
    """Per scheme: ``steps`` decode steps of ``len(prompts)`` rows on the engine's own
    batch, interleaved across schemes, each timed until its tokens are sampled; the step
    times (ms) and the pool's bytes per token."""
    from mlxbun_core.engine.batch import BLOCK_SIZE, FIRST_BLOCKS, NO_LIMIT, BlockPool
    from mlxbun_core.engine.batch.executor import Batch
    from mlxbun_core.engine.batch.layout import layout

    batches = {}
    for s, scheme in schemes.items():
        b = Batch(model, layout(model), BlockPool(BLOCK_SIZE, FIRST_BLOCKS, NO_LIMIT),
                  kv=scheme)
        for i, p in enumerate(prompts):
            b.add(i, p, budget=steps + 2)
        while b.prefilling:
            b.prefill({u: chunk for u in b.prefilling})
        b.decode()  # feeds the prompts' last tokens: nothing to hand out yet
        batches[s] = b
    times: dict = {s: [] for s in schemes}
    for _ in range(steps):
        for s, b in batches.items():
            t = time.perf_counter()
            b.decode()
            mx.eval([b.pending(u)[0] for u in b.decoding])  # this step's samples
            times[s].append(1000 * (time.perf_counter() - t))
    out = {s: {"step_ms": times[s],
               "pool_bytes_per_token": b.layout.bytes_per_block() / BLOCK_SIZE}
           for s, b in batches.items()}
    for b in batches.values():
        b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="small", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4, help="including one warm-up round")
    ap.add_argument("--rows", type=int, default=8, help="rows of the batched measurement (0: skip)")
    ap.add_argument("--batch-context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=40, help="batched decode steps per scheme")
    ap.add_argument("--prefill-step", type=int, default=2048)
    ap.add_argument("--budget-gb", type=float, nargs="*", default=[24.0, 48.0],
                    help="memory budgets (GB, 10^9) to report max_safe_context under")
    ap.add_argument("--model", default=None, help="a checkpoint dir (default: a random --shape)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from mlx_lm import load

    from mlxbun_core import kvquant
    from mlxbun_core.library import fit
    from mlxbun_core.models.facts import weight_bytes
    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    ckpt = (Path(args.model) if args.model else
            tiny_checkpoint("llama", config_overrides=SHAPES[args.shape], dtype=dtype))
    model, tok = load(str(ckpt))
    config = json.loads((ckpt / "config.json").read_text())
    weights = weight_bytes(model)
    machine = fit.machine()
    ban = list(tok.eos_token_ids)
    rng = mx.random.key(0)
    vocab = config["vocab_size"]
    prompt = mx.random.randint(10, vocab - 10, (max(args.contexts) + 1,), key=rng).tolist()

    schemes = {s: kvquant.parse(s) for s in SCHEMES}
    wrapped = {s: kvquant.quantizing(model, sch) for s, sch in schemes.items()}
    sizes, caches = {}, {}
    for s, sch in schemes.items():
        layout = fit.kv_layout(config, kv_bits=sch.bits)
        row = {"bytes_per_token": layout.bytes_per_token,
               "max_safe_context_machine": fit.plan(config, weights, machine.usable_bytes,
                                                    kv_bits=sch.bits).max_safe_context}
        for gb in args.budget_gb:
            row[f"max_safe_context_{gb:g}GB"] = fit.plan(config, weights, int(gb * 1e9),
                                                         kv_bits=sch.bits).max_safe_context
        for ctx in args.contexts:
            t = time.perf_counter()
            caches[s, ctx] = prefill(wrapped[s], prompt[:ctx], args.prefill_step)
            row[f"prefill_s_{ctx}"] = round(time.perf_counter() - t, 2)
            held = sum(c.nbytes for c in caches[s, ctx])
            row[f"cache_bytes_{ctx}"] = held
            row[f"fit_bytes_{ctx}"] = layout.bytes_at(ctx)
        sizes[s] = row
        print(s, json.dumps(row), flush=True)

    tps = {(s, ctx): [] for s in SCHEMES for ctx in args.contexts}
    batched: dict = {}
    prompts = [mx.random.randint(10, vocab - 10, (args.batch_context,), key=mx.random.key(i + 1))
               .tolist() for i in range(args.rows)]
    for r in range(args.rounds):
        for ctx in args.contexts:
            for s in SCHEMES:
                tps[s, ctx].append(decode_tps(wrapped[s], caches[s, ctx], prompt[ctx], args.tokens,
                                              ban))
        print(f"round {r}: " + "  ".join(f"{s}@{ctx}={v[-1]:.1f}" for (s, ctx), v in tps.items()),
              flush=True)
    if args.rows:
        batched = pool_steps(model, schemes, prompts, args.steps, args.prefill_step)

    def med(values):
        return round(statistics.median(values[1:] if len(values) > 1 else values), 2)

    table = []
    for s in SCHEMES:
        row = {"kv_quant": s, **sizes[s]}
        for ctx in args.contexts:
            row[f"decode_tps_{ctx}"] = med(tps[s, ctx])
            row[f"vs_off_{ctx}"] = round(med(tps[s, ctx]) / med(tps["off", ctx]), 3)
        if args.rows:
            q1, q2, q3 = statistics.quantiles(batched[s]["step_ms"], n=4)
            off = statistics.median(batched["off"]["step_ms"])
            row[f"step_ms_{args.rows}x{args.batch_context}"] = round(q2, 2)
            row["step_ms_quartiles"] = [round(q1, 2), round(q3, 2)]
            row["step_vs_off"] = round(q2 / off, 3)
            row["pool_bytes_per_token"] = batched[s]["pool_bytes_per_token"]
        table.append(row)
    meta = {"device": str(mx.default_device()), "chip": machine.name, "shape": args.shape,
            "dtype": dtype, "weights_bytes": weights, "usable_bytes": machine.usable_bytes,
            "tokens": args.tokens, "rounds": args.rounds, "rows": args.rows,
            "batch_context": args.batch_context, "steps": args.steps, "mlx": mx.__version__}
    print(json.dumps(meta))
    cols = ["bytes_per_token", "max_safe_context_machine",
            *[f"max_safe_context_{gb:g}GB" for gb in args.budget_gb],
            *[f"decode_tps_{c}" for c in args.contexts], *[f"vs_off_{c}" for c in args.contexts],
            *([f"step_ms_{args.rows}x{args.batch_context}", "step_vs_off",
               "pool_bytes_per_token"] if args.rows else [])]
    print("kv_quant " + " ".join(cols))
    for row in table:
        print(f"{row['kv_quant']:8} " + " ".join(str(row[c]) for c in cols))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": table}, f, indent=1)


if __name__ == "__main__":
    main()
