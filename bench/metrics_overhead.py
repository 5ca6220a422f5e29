"""What the Prometheus metrics cost: per-call costs, a scrape, and decode tok/s on or off.

1. In this process, no model: ns per ``StepTally.add`` (the batch lane's one call per decode
   step) and µs per ``EngineMetrics.finished`` (once per generation, on the worker thread).
2. One engine (a llama-shaped random checkpoint), in this process, every config alternating for
   ``--rounds`` rounds (the median is reported): aggregate decode tok/s of ``--rows``
   concurrent greedy generations of ``--tokens`` tokens (EOS banned) and of one lone stream,
   with metrics recording on and with it switched off (the engine's ``on_finish`` cleared and
   ``StepTally.add`` replaced by a no-op); and the server-side time of one scrape
   (``generate_latest`` over the app's registry) after the runs.

    python bench/metrics_overhead.py                          # tiny llama, CPU smoke run
    python bench/metrics_overhead.py --shape 1b --dtype bfloat16 --tokens 256 --out r.json

Expected: "off/on" ratios of 1.00 within noise (nothing is recorded per token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import timeit
from types import SimpleNamespace

SHAPES = {
    "tiny": {},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}


def call_costs() -> dict:
    from mlxbun_core.engine.lanes.tally import StepTally
    from mlxbun_core.events import Finish, Usage
    from mlxbun_core.metrics.engine import EngineMetrics

    tally = StepTally()
    n = 1_000_000
    add_ns = timeit.timeit(lambda: tally.add(8), number=n) / n * 1e9
    baseline_ns = timeit.timeit(lambda: None, number=n) / n * 1e9
    metrics = EngineMetrics(SimpleNamespace(model=SimpleNamespace(id="bench")))
    fin = Finish("length", Usage(prompt_tokens=100, completion_tokens=256, cached_tokens=64,
                                 lane="batched"),
                 timings={"total_s": 2.0, "ttft_s": 0.05, "admission_wait_s": 0.001})
    m = 100_000
    finished_us = timeit.timeit(lambda: metrics.finished(fin), number=m) / m * 1e6
    return {"step_tally_add_ns": round(add_ns - baseline_ns, 1),
            "finished_us": round(finished_us, 2)}


def switch(engine, on: bool, saved: dict) -> None:
    """Metrics recording on, or replaced by no-ops."""
    from mlxbun_core.engine.lanes import tally
    from mlxbun_core.metrics import for_engine

    if not saved:
        saved.update(add=tally.StepTally.add)
    engine.on_finish = for_engine(engine).finished if on else None
    tally.StepTally.add = saved["add"] if on else (lambda self, rows: None)


async def decode(engine, rows: int, tokens: int, bias: dict) -> float:
    """Aggregate decode tok/s of ``rows`` concurrent greedy generations."""
    async def one(i):
        body = {"prompt": f"Row {i} once upon a time", "max_tokens": tokens, "temperature": 0,
                "logit_bias": bias}
        gen = await engine.start(engine.parse_completion(body))
        return [e async for e in gen.events()][-1].finish

    t0 = time.perf_counter()
    finishes = await asyncio.gather(*(one(i) for i in range(rows)))
    elapsed = time.perf_counter() - t0
    assert all(f.usage.completion_tokens == tokens for f in finishes)
    return rows * tokens / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from prometheus_client import generate_latest

    from mlxbun_core.engine.core import Engine
    from mlxbun_core.server.app import build_app
    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    result = {"args": vars(args), "calls": call_costs()}
    print(json.dumps(result["calls"]))
    ckpt = tiny_checkpoint("llama", config_overrides=SHAPES[args.shape], dtype=args.dtype)
    engine = Engine.load(str(ckpt), progress=False, batch=args.rows, prompt_cache_bytes=0)
    app = build_app(engine)
    bias = {str(i): -100 for i in engine.model.tokenizer.eos_token_ids}
    saved: dict = {}
    runs = {(on, rows): [] for on in (True, False) for rows in (args.rows, 1)}
    asyncio.run(decode(engine, args.rows, 8, bias))  # warm-up
    configs = list(runs)
    for r in range(args.rounds):  # the order flips every round, so drift hits both alike
        for on, rows in (configs if r % 2 == 0 else configs[::-1]):
            switch(engine, on, saved)
            runs[(on, rows)].append(asyncio.run(decode(engine, rows, args.tokens, bias)))
    switch(engine, True, saved)
    scrape_ms = [timeit.timeit(lambda: generate_latest(app.state.metrics), number=1) * 1e3
                 for _ in range(20)]
    result["decode_tps"] = {f"{'on' if on else 'off'}_rows{rows}": round(statistics.median(v), 1)
                            for (on, rows), v in runs.items()}
    for rows in (args.rows, 1):
        d = result["decode_tps"]
        result["decode_tps"][f"off_over_on_rows{rows}"] = round(
            d[f"off_rows{rows}"] / d[f"on_rows{rows}"], 3)
    result["scrape_ms_median"] = round(statistics.median(scrape_ms), 3)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    engine.worker.close()


if __name__ == "__main__":
    main()
