"""What recording log-probs costs per generated token, old way against new.

Per token the engine turns the step's full-vocabulary log-prob vector into one entry:
the sampled token's log-prob and, with ``top_logprobs: k``, the k best, each with its text
and bytes. This times, on one tokenizer and one random vector per step:

  old   the previous code: ``.item()`` for the sampled token, then argpartition, two
        ``.tolist()`` and ``convert_ids_to_tokens`` (raw vocabulary pieces, no bytes);
  new   ``LogprobRecorder.entry``: one evaluation for the sampled value and the top k,
        text and bytes from the cached per-token table.

Then end to end over HTTP, in this process: decode tok/s of a greedy streamed chat without
log-probs, with ``logprobs: true`` and with ``top_logprobs: 5`` (median of ``--rounds``
alternating rounds).

    python bench/logprobs_cost.py                     # the embedded SmolLM2 (vocab 49,152)
    python bench/logprobs_cost.py --model DIR --tokens 256 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx
import mlx.core as mx

import bench_home  # this folder


def old_entry(tokenizer, token, logprobs, k):
    entry = {"id": int(token), "logprob": logprobs[token].item()}
    if k > 0:
        top = mx.argpartition(-logprobs, kth=k - 1)[:k]
        vals = logprobs[top].tolist()
        pairs = sorted(zip(top.tolist(), vals), key=lambda p: -p[1])
        names = tokenizer.convert_ids_to_tokens([p[0] for p in pairs])
        tops = [{"id": i, "token": n, "logprob": v} for (i, v), n in zip(pairs, names)]
        entry = dict(tops[0], top_logprobs=tops)
    return entry


def per_token_us(tokenizer, vocab: int, k: int, steps: int, rounds: int) -> dict:
    """Median µs per token of each way, over ``rounds`` alternating rounds."""
    from mlxbun_core.engine.logprobs import LogprobRecorder

    vectors = []
    for i in range(steps):
        logits = mx.random.normal((vocab,), key=mx.random.key(i))
        vectors.append(logits - mx.logsumexp(logits))
    mx.eval(vectors)
    tokens = [int(mx.argmax(v).item()) for v in vectors]
    recorder = LogprobRecorder(tokenizer, k)
    ways = {"old": lambda t, v: old_entry(tokenizer, t, v, k), "new": recorder.entry}
    times: dict = {name: [] for name in ways}
    for _ in range(rounds + 1):  # the first round warms up (and fills the new table)
        for name, fn in ways.items():
            t0 = time.perf_counter()
            for t, v in zip(tokens, vectors):
                fn(t, v)
            times[name].append(1e6 * (time.perf_counter() - t0) / steps)
    return {name: statistics.median(values[1:]) for name, values in times.items()}


def stream_tps(base: str, tokens: int, extra: dict) -> float:
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": tokens, "temperature": 0, "stream": True, **extra}
    first = last = None
    count = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                last = time.perf_counter()
                first = first or last
                count += 1
    return (count - 1) / max(last - first, 1e-9) if count > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded SmolLM2)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--no-stream", action="store_true", help="the per-token part only")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)

    from mlxbun_core.testing.server import start_server

    srv = start_server(args.model)
    try:
        tok = srv.engine.model.tokenizer
        vocab = int(srv.engine.model.config.get("vocab_size") or len(tok))
        print(f"model {srv.engine.model.id}, vocab {vocab}, {mx.default_device()}")
        for k in (0, 5):
            us = per_token_us(tok, vocab, k, args.steps, args.rounds)
            print(f"  record one token, top_logprobs={k}: old {us['old']:.0f} µs, "
                  f"new {us['new']:.0f} µs (new has text and bytes)")
        if args.no_stream:
            return
        ban = {str(i): -100 for i in tok.eos_token_ids}  # every run full length
        configs = {"plain": {}, "logprobs": {"logprobs": True},
                   "top_logprobs=5": {"top_logprobs": 5}}
        runs = {name: [] for name in configs}
        stream_tps(srv.base_url, 8, {"logit_bias": ban})  # warm-up
        for _ in range(args.rounds):
            for name, extra in configs.items():
                runs[name].append(stream_tps(srv.base_url, args.tokens,
                                             {"logit_bias": ban, **extra}))
        base = statistics.median(runs["plain"])
        for name, values in runs.items():
            tps = statistics.median(values)
            print(f"  stream {name:>15}: {tps:7.1f} tok/s ({tps / base:.3f}x)")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
