"""Many adapters in one batch: aggregate tok/s of 8 clients on 8 different LoRA adapters
(rows mixed per batch), against 8 clients on one adapter, against the same 8 adapters with
mixing off (one adapter set per batch: today's serialized behaviour), and the base model.

One in-process engine (batch ``--clients``, prefix cache off); every arm sends the same
prompts (``--prompt-tokens`` random tokens), greedy, EOS banned so every request runs
``--max-tokens``; each client sends ``--requests`` requests back to back. Arms alternate
order every round (A B C D / D C B A) for ``--rounds`` rounds after one unmeasured
warm-up round; reported: median aggregate tok/s per arm and the median of the per-round
ratios. The mixed and serialized arms run the same requests with the same adapters, so
their greedy tokens must agree (checked; a mismatch is printed and exits non-zero).

    python bench/many_adapters.py                                  # tiny qwen3, CPU
    python bench/many_adapters.py --shape 8b --max-tokens 256 --prompt-tokens 128 \\
        --rounds 5 --out bench/results/many_adapters_h200.json    # H200, bf16 8B shape
    python bench/many_adapters.py --model /path/to/checkpoint ...   # a real model

Adapters are random mlx-lm LoRA directories written for the served model: rank
``--rank`` on ``--targets`` of every layer (scale 2.0, float32 factors, as mlx-lm trains).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {  # Qwen3 shapes; "8b" is Qwen3-8B's body (vocab kept at the test tokenizer's size)
    "tiny": {},
    "8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}


def checkpoint(args) -> str:
    if args.model:
        return args.model
    import mlx.core as mx

    from mlxbun_core.testing.checkpoints import write_checkpoint

    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    path = f"{tempfile.gettempdir()}/bench-qwen3-{args.shape}-{dtype}"
    if not os.path.exists(os.path.join(path, "config.json")):
        write_checkpoint(path, "qwen3", seed=11, dtype=dtype, config_overrides=SHAPES[args.shape])
    return path


def write_adapters(model, root: str, n: int, rank: int, targets: list) -> list:
    """``n`` random mlx-lm adapter directories over ``targets`` of every layer of ``model``."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlxbun_core.adapters.layers import expected_shapes

    paths = [(name, m) for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] in targets
             and isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    out = []
    for i in range(n):
        key = mx.random.key(100 + i)
        weights = {}
        for name, module in paths:
            (a_shape, b_shape) = expected_shapes(module, rank)
            key, ka, kb = mx.random.split(key, 3)
            weights[f"{name}.lora_a"] = mx.random.normal(a_shape, key=ka) / a_shape[0] ** 0.5
            weights[f"{name}.lora_b"] = mx.random.normal(b_shape, key=kb) * 0.5 / rank ** 0.5
        d = os.path.join(root, f"lora{i}")
        os.makedirs(d, exist_ok=True)
        mx.save_safetensors(os.path.join(d, "adapters.safetensors"), weights)
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"fine_tune_type": "lora", "num_layers": -1,
                       "lora_parameters": {"rank": rank, "scale": 2.0, "dropout": 0.0,
                                           "keys": targets}}, f)
        out.append(d)
    return out


async def run_arm(engine, bodies_by_client: list) -> tuple[float, int, list]:
    """Every client sends its bodies back to back; (wall s, tokens, token ids per body)."""
    from mlxbun_core.engine.reply import gather

    async def client(bodies):
        got = []
        for body in bodies:
            gen = await engine.start(engine.parse_completion(dict(body)))
            reply = gather([ev async for ev in gen.events()])
            got.append((reply.finish.usage.completion_tokens,
                        [e["id"] for e in reply.finish.logprobs]))
        return got

    t0 = time.perf_counter()
    per_client = await asyncio.gather(*[client(b) for b in bodies_by_client])
    wall = time.perf_counter() - t0
    flat = [x for c in per_client for x in c]
    return wall, sum(n for n, _ in flat), [ids for _, ids in flat]


def step_costs(engine, n_rows: int, rounds: int, steps: int = 32) -> dict:
    """ms per decode step of the bare model at ``n_rows`` rows (no lanes, no sampling):
    the base model, every row on one adapter, every row on its own adapter; arms
    alternate step block by step block. Runs on the worker thread (the model's)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxbun_core.adapters.manager import NO_ADAPTERS

    manager = engine.adapters
    mounted = list(manager.mounted.values())
    arms = {"base": [NO_ADAPTERS] * n_rows,
            "one": [manager.resolve(mounted[0].id)] * n_rows,
            "mixed": [manager.resolve(mounted[i % len(mounted)].id) for i in range(n_rows)]}
    model = engine.model.model
    times: dict = {name: [] for name in arms}
    for rnd in range(rounds + 1):
        for name in (list(arms) if rnd % 2 == 0 else list(arms)[::-1]):
            manager.route(arms[name])
            cache = make_prompt_cache(model)
            tokens = mx.array([[7 + i] * 16 for i in range(n_rows)])
            mx.eval(model(tokens, cache=cache))
            y = tokens[:, -1:]
            t0 = time.perf_counter()
            for _ in range(steps):
                y = mx.argmax(model(y, cache=cache)[:, -1:, :], axis=-1)
                mx.eval(y)
            if rnd:
                times[name].append(1e3 * (time.perf_counter() - t0) / steps)
    manager.activate(NO_ADAPTERS)
    return {name: round(statistics.median(v), 3) for name, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a checkpoint (default: a random one)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--dtype", default=None, help="random checkpoint dtype (default: float32 "
                                                  "on the CPU, else bfloat16)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="per client, back to back")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--step-rounds", type=int, default=7,
                    help="rounds of the bare decode-step timing (0: skip it)")
    args = ap.parse_args()

    from mlxbun_core.engine.core import Engine

    ckpt = checkpoint(args)
    engine = Engine.load(ckpt, progress=False, batch=args.clients, prompt_cache_bytes=0)
    tok = engine.model.tokenizer
    root = tempfile.mkdtemp(prefix="many-adapters-")
    dirs = engine.worker.run_sync(lambda: write_adapters(
        engine.model.model, root, args.clients, args.rank, args.targets.split(",")))
    for i, d in enumerate(dirs):
        engine.worker.run_sync(lambda i=i, d=d: engine.adapters.mount(f"lora{i}", d,
                                                                     force=True))
    rng = random.Random(5)
    vocab = min(tok.vocab_size, 30000)
    prompts = [[tok.decode([rng.randrange(100, vocab) for _ in range(args.prompt_tokens)])
                for _ in range(args.requests)] for _ in range(args.clients)]
    ban = {str(i): -100 for i in tok.eos_token_ids}

    def bodies(adapter_of):
        return [[{"prompt": p, "max_tokens": args.max_tokens, "temperature": 0,
                  "logprobs": True, "logit_bias": ban, "adapter": adapter_of(c)}
                 for p in prompts[c]] for c in range(args.clients)]

    arms = {  # name: (mixing, adapter of client c)
        "mixed": (True, lambda c: f"lora{c}"),
        "one": (True, lambda c: "lora0"),
        "serialized": (False, lambda c: f"lora{c}"),
        "base": (True, lambda c: "none"),
    }
    results: dict = {name: [] for name in arms}
    tokens: dict = {}
    for rnd in range(args.rounds + 1):  # round 0 warms up (kernels, stacks)
        order = list(arms) if rnd % 2 == 0 else list(arms)[::-1]
        for name in order:
            mixing, adapter_of = arms[name]
            engine.adapters.mixing = mixing
            wall, n, ids = asyncio.run(run_arm(engine, bodies(adapter_of)))
            tokens[name] = ids
            if rnd:
                results[name].append(n / wall)
            print(f"round {rnd} {name:10s} {n / wall:9.1f} tok/s ({n} tok, {wall:.2f} s)",
                  flush=True)
    stats = engine.adapters.stats()
    same = tokens["mixed"] == tokens["serialized"]
    steps = engine.worker.run_sync(lambda: step_costs(engine, args.clients, args.step_rounds)) \
        if args.step_rounds else {}
    med = {name: statistics.median(v) for name, v in results.items()}
    ratios = {f"mixed/{other}": statistics.median(
        m / o for m, o in zip(results["mixed"], results[other]))
        for other in ("one", "serialized", "base")}
    print(json.dumps({"median_tok_s": {k: round(v, 1) for k, v in med.items()},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()},
                      "mixed_tokens_equal_serialized": same,
                      "decode_step_ms": steps, "adapter_stats": stats}, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "tok_s": results, "median_tok_s": med,
                       "ratios": ratios, "mixed_tokens_equal_serialized": same,
                       "decode_step_ms": steps, "adapter_stats": stats}, f, indent=2)
    engine.worker.close()
    if not same:
        sys.exit("mixed and serialized arms produced different greedy tokens")
    os._exit(0)  # no interpreter teardown under a live MLX worker thread


if __name__ == "__main__":
    main()
