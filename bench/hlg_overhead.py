"""What HLG tone-curve sampling costs per decode step, against mlx-lm's temperature sampler.

Part 1, the sampler alone: ms per call on a ``[rows, vocab]`` log-prob batch (one evaluation per
call, as a decode step does) for mlx-lm's ``make_sampler(temp=0.8)``, the HLG curve
(``hlg`` knobs) and a drawn 8-point transfer curve (``hlg.points``).

Part 2, end to end over HTTP in this process: decode tok/s of streamed completions at
temperature 0.8 with and without ``hlg``, for one stream and for ``--clients`` concurrent ones
(the batch lane), median of ``--rounds`` alternating rounds. EOS is banned so every run is
full length.

    python bench/hlg_overhead.py                          # the embedded SmolLM2 (vocab 49,152)
    python bench/hlg_overhead.py --model DIR --tokens 256 --clients 8 --rounds 5
    python bench/hlg_overhead.py --vocab 151936 --rows 1,8,32 --skip-http
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx
import mlx.core as mx

import bench_home  # this folder

HLG = {"enabled": True, "width": 4, "shoulder": 4, "toe": 6, "pivot_offset": 6}
POINTS = [[-20, -20], [-14, -19], [-10, -17], [-7, -14], [-5, -11], [-3, -7], [-1, -2], [0, 0]]


def sampler_ms(vocab: int, rows: int, steps: int) -> dict[str, float]:
    from mlx_lm.sample_utils import make_sampler

    from mlxbun_core.engine.hlg import parse_hlg

    samplers = {"temperature": make_sampler(temp=0.8),
                "hlg": parse_hlg(HLG).sampler(0.8),
                "points": parse_hlg({"points": POINTS}).sampler(0.8)}
    logits = mx.random.normal((rows, vocab)).astype(mx.bfloat16)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(logprobs)
    out = {}
    for name, sample in samplers.items():
        for _ in range(5):
            mx.eval(sample(logprobs))
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            mx.eval(sample(logprobs))
            times.append(1e3 * (time.perf_counter() - t0))
        out[name] = statistics.median(times)
    return out


def stream_tps(base: str, tokens: int, extra: dict, tps: list) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0.8,
            "stream": True, **extra}
    first = last = None
    count = 0
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"text":"' in line:
                last = time.perf_counter()
                first = first or last
                count += 1
    tps.append((count - 1) / max(last - first, 1e-9) if count > 1 else 0.0)


def aggregate_tps(base: str, tokens: int, clients: int, extra: dict) -> float:
    tps: list = []
    threads = [threading.Thread(target=stream_tps, args=(base, tokens, extra, tps))
               for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tps)


def http_part(model: str | None, tokens: int, clients: int, rounds: int) -> None:
    from mlxbun_core.testing.server import start_server

    srv = start_server(model, prompt_cache_bytes=0)
    try:
        eos = srv.engine.model.tokenizer.eos_token_ids
        no_eos = {"logit_bias": {str(i): -100 for i in eos}}
        ways = {"temperature": no_eos, "hlg": {**no_eos, "hlg": HLG},
                "points": {**no_eos, "hlg": {"points": POINTS}}}
        for n in sorted({1, clients}):
            results: dict = {name: [] for name in ways}
            aggregate_tps(srv.base_url, 16, n, no_eos)  # warm-up
            for _ in range(rounds):
                for name, extra in ways.items():
                    results[name].append(aggregate_tps(srv.base_url, tokens, n, extra))
            base = statistics.median(results["temperature"])
            row = ", ".join(f"{name} {statistics.median(v):.1f} tok/s "
                            f"({statistics.median(v) / base:.3f}×)" for name, v in results.items())
            print(f"{n} client(s), {tokens} tokens: {row}")
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded SmolLM2)")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", default="1,8,32", help="batch rows for part 1, comma-separated")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-http", action="store_true")
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)
    print(f"mlx {mx.__version__}, device {mx.default_device()}")
    for rows in (int(r) for r in args.rows.split(",")):
        ms = sampler_ms(args.vocab, rows, args.steps)
        print(f"sampler, {rows} x {args.vocab}: " + ", ".join(
            f"{k} {v:.3f} ms ({v / ms['temperature']:.2f}×)" for k, v in ms.items()))
    if not args.skip_http:
        http_part(args.model, args.tokens, args.clients, args.rounds)


if __name__ == "__main__":
    main()
