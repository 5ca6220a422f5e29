"""Many clients at once: mlxbun against mlx_lm.server on the same checkpoint, same run.

Both servers run side by side on one checkpoint, as fresh processes every round (nothing a
round leaves behind carries over); load phases alternate A B / B A for ``--rounds`` rounds so
background load hits both alike. Per concurrency level, every
client sends ``--requests`` streaming /v1/completions requests back to back, each with
its own random prompt of ``--prompt-tokens`` tokens (so no prompt cache helps either
side), greedy, ``--max-tokens`` new tokens. Reported per level: aggregate tok/s (all
completion tokens / wall time), median TTFT, single-stream decode tok/s, failures.

Also measured in the same run:
- mlx-lm's own ``BatchGenerator`` at batch ``--batchgen``, in this process, with the
  same prompt and output lengths (the library ceiling our batch lane builds on);
- a second chat turn over a shared ``--history-tokens`` history on mlxbun: its TTFT
  against the first turn's (the prefix cache at work), and the same on mlx_lm.server.

    python bench/serve_concurrency.py                             # tiny qwen3, CPU
    python bench/serve_concurrency.py --shape 8b --concurrency 1 32 --mlxbun-batch 32 \\
        --rounds 3 --out bench/results/serve_concurrency_h200.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time

import httpx

import bench_home  # this folder

SHAPES = {  # Qwen3 shapes; "8b" is Qwen3-8B's body (vocab kept at the test tokenizer's size)
    "tiny": {},
    "small": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 4,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list, port: int, log_path: str) -> subprocess.Popen:
    """Start a server and wait until it answers; it keeps its home out of the user's
    (:mod:`bench_home`: a temporary one unless the bench was given ``--home``)."""
    bench_home.use()
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 900
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[:4]} exited {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{cmd[:4]} did not start")


def random_prompt(tok, n: int, rng: random.Random) -> str:
    ids = [rng.randrange(100, min(tok.vocab_size, 30000)) for _ in range(n)]
    return tok.decode(ids)


async def one_request(c: httpx.AsyncClient, base: str, body: dict) -> dict:
    t0 = time.perf_counter()
    first = None
    usage = None
    try:
        async with c.stream("POST", base + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False, "status": r.status_code}
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                obj = json.loads(line[6:])
                ch = (obj.get("choices") or [{}])[0]
                if ch.get("text") and first is None:
                    first = time.perf_counter()
                if obj.get("usage"):
                    usage = obj["usage"]
    except httpx.HTTPError as exc:
        return {"ok": False, "status": type(exc).__name__}
    end = time.perf_counter()
    n = (usage or {}).get("completion_tokens", 0)
    if first is None or n == 0:
        return {"ok": False, "status": "no tokens"}
    return {"ok": True, "ttft": first - t0, "tokens": n, "start": t0, "end": end,
            "decode_tps": (n - 1) / max(end - first, 1e-9)}


async def load_phase(base: str, conc: int, requests: int, prompts, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=conc + 4, max_keepalive_connections=conc + 4)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as c:
        async def client(i):
            out = []
            for j in range(requests):
                body = {"prompt": prompts[(i * requests + j) % len(prompts)], "stream": True,
                        "max_tokens": max_tokens, "temperature": 0,
                        "stream_options": {"include_usage": True}}
                out.append(await one_request(c, base, body))
            return out

        t0 = time.perf_counter()
        runs = [r for rs in await asyncio.gather(*[client(i) for i in range(conc)]) for r in rs]
        wall = time.perf_counter() - t0
    ok = [r for r in runs if r["ok"]]
    return {"aggregate_tps": sum(r["tokens"] for r in ok) / wall, "wall_s": wall,
            "ttft_median_s": statistics.median(r["ttft"] for r in ok) if ok else None,
            "decode_tps_median": statistics.median(r["decode_tps"] for r in ok) if ok else None,
            "failed": len(runs) - len(ok), "requests": len(runs),
            "errors": sorted({str(r["status"]) for r in runs if not r["ok"]})}


async def chat_ttft(c: httpx.AsyncClient, base: str, messages: list, max_tokens: int):
    t0, first, text = time.perf_counter(), None, []
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    async with c.stream("POST", base + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                delta = ((json.loads(line[6:]).get("choices") or [{}])[0].get("delta")) or {}
                if delta.get("content"):
                    first = first or time.perf_counter()
                    text.append(delta["content"])
    return (first or time.perf_counter()) - t0, "".join(text)


async def second_turn(base: str, history: str, rng: random.Random) -> dict:
    async with httpx.AsyncClient(timeout=1800) as c:
        msgs = [{"role": "system", "content": history},
                {"role": "user", "content": f"Question {rng.random()}: summarise the above."}]
        t1, reply = await chat_ttft(c, base, msgs, 32)
        msgs += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "And in one word?"}]
        t2, _ = await chat_ttft(c, base, msgs, 8)
    return {"first_ttft_s": t1, "second_ttft_s": t2, "ratio": t2 / t1}


def direct_decode(model, tok, prompt: str, n: int) -> float:
    """mlx-lm's own single-stream decode tok/s (the floor and a machine-drift check)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    first, count = None, 0
    for _ in generate_step(mx.array(tok.encode(prompt)), model, max_tokens=n):
        count += 1
        first = first or time.perf_counter()
    return (count - 1) / (time.perf_counter() - first)


def batch_generator(model, tok, prompts, batch: int, max_tokens: int) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    toks = [tok.encode(p) for p in prompts[:batch]]
    gen = BatchGenerator(model, max_tokens=max_tokens, completion_batch_size=batch,
                         prefill_batch_size=batch)
    t0 = time.perf_counter()
    gen.insert(toks, max_tokens=[max_tokens] * len(toks))
    n, left = 0, len(toks)
    while left:
        for r in gen.next_generated():
            n += 1
            left -= r.finish_reason is not None
    mx.synchronize()
    wall = time.perf_counter() - t0
    gen.close()
    del gen
    mx.clear_cache()  # give the memory back before the servers run again
    return {"aggregate_tps": n / wall, "tokens": n, "wall_s": wall}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None,
                    help="a checkpoint dir (default: a random-weight --shape)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 8],
                    help="client counts of the load phases (none: only the chat turns)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per phase")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mlxbun-batch", type=int, default=8)
    ap.add_argument("--batchgen", type=int, default=8)
    ap.add_argument("--history-tokens", type=int, default=4096)
    ap.add_argument("--turns", type=int, default=1,
                    help="measured two-turn chats per server and round (after one unmeasured)")
    ap.add_argument("--out", default=None)
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)

    import mlx.core as mx
    from mlx_lm import load

    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    if args.model:
        ckpt = args.model
    else:
        from mlxbun_core.testing.checkpoints import write_checkpoint

        ckpt = f"/tmp/bench-qwen3-{args.shape}-{dtype}"
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            write_checkpoint(ckpt, "qwen3", seed=11, dtype=dtype,
                             config_overrides=SHAPES[args.shape])
    model, tok = load(str(ckpt))
    rng = random.Random(3)
    n_prompts = max(args.concurrency or [1]) * args.requests
    prompts = [random_prompt(tok, args.prompt_tokens, rng) for _ in range(n_prompts)]
    warm = [random_prompt(tok, args.prompt_tokens, rng) for _ in range(2)]  # never measured

    commands = {
        "mlxbun": lambda port: [sys.executable, "-m", "mlxbun_core.cli", "serve", str(ckpt),
                                "--port", str(port), "--batch", str(args.mlxbun_batch),
                                "--log-level", "warning"],
        "mlx_lm.server": lambda port: [sys.executable, "-m", "mlx_lm.server", "--model", str(ckpt),
                                       "--port", str(port)],
    }
    results = {name: {c: [] for c in args.concurrency} for name in commands}
    turns = {name: [] for name in commands}
    batchgen, direct = [], []
    batch_generator(model, tok, warm * args.batchgen, args.batchgen, 4)  # compile its kernels
    for rnd in range(args.rounds):
        # fresh server processes every round: nothing one round left behind (caches, memory)
        # carries into the next, and both start equal
        servers = {}
        for name, cmd in commands.items():
            port = free_port()
            servers[name] = (f"http://127.0.0.1:{port}",
                             start(cmd(port), port, f"/tmp/bench-{name}.log"))
        try:
            for base, _ in servers.values():  # warm-up: kernels, caches
                asyncio.run(load_phase(base, 2, 1, warm, 8))
            order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
            direct.append(direct_decode(model, tok, prompts[0], args.max_tokens))
            for conc in args.concurrency:
                for name in order:
                    res = asyncio.run(load_phase(servers[name][0], conc, args.requests, prompts,
                                                 args.max_tokens))
                    results[name][conc].append(res)
                    print(f"round {rnd} c={conc} {name}: {res['aggregate_tps']:.1f} tok/s, "
                          f"ttft {res['ttft_median_s']}, stream {res['decode_tps_median']}, "
                          f"failed {res['failed']}", flush=True)
            # two-turn chats, each over a history the server has not seen; the first one
            # warms this prompt length's kernels and is not counted
            for t in range(args.turns + 1):
                history = random_prompt(tok, args.history_tokens, random.Random(1000 * t + rnd))
                for name in order:
                    pair = asyncio.run(second_turn(servers[name][0], history, random.Random(rnd)))
                    if t:
                        turns[name].append(pair)
        finally:
            for _, proc in servers.values():
                proc.terminate()
                proc.wait(120)
        if args.concurrency:
            batchgen.append(batch_generator(model, tok, prompts, args.batchgen, args.max_tokens))
        direct.append(direct_decode(model, tok, prompts[0], args.max_tokens))
        print(f"round {rnd} mlx-lm direct decode {direct[-2]:.1f} / {direct[-1]:.1f} tok/s, "
              f"BatchGenerator {med(batchgen[-1:], 'aggregate_tps')} tok/s", flush=True)
    report(args, dtype, results, turns, batchgen, direct)


def med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def report(args, dtype, results, turns, batchgen, direct):
    import mlx.core as mx

    table = []
    for conc in args.concurrency:
        a, b = results["mlxbun"][conc], results["mlx_lm.server"][conc]
        ratios = [x["aggregate_tps"] / y["aggregate_tps"] for x, y in zip(a, b)]
        table.append({"concurrency": conc,
                      "mlxbun_tps": med(a, "aggregate_tps"),
                      "mlx_lm_server_tps": med(b, "aggregate_tps"),
                      "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                      "mlxbun_ttft_s": med(a, "ttft_median_s"),
                      "mlx_lm_server_ttft_s": med(b, "ttft_median_s"),
                      "mlxbun_stream_decode_tps": med(a, "decode_tps_median"),
                      "mlx_lm_server_stream_decode_tps": med(b, "decode_tps_median"),
                      "mlxbun_failed": sum(x["failed"] for x in a),
                      "mlx_lm_server_failed": sum(y["failed"] for y in b),
                      "requests_per_round": a[0]["requests"]})
    bg = med(batchgen, "aggregate_tps")
    c8 = [row for row in table if row["concurrency"] == args.batchgen]
    summary = {
        "mlx_lm_direct_decode_tps": statistics.median(direct),
        "batchgen_tps": bg,
        "mlxbun_vs_batchgen": (c8[0]["mlxbun_tps"] / bg) if c8 and bg else None,
        "second_turn_ratio_mlxbun": med(turns["mlxbun"], "ratio"),
        "second_turn_ratio_mlx_lm_server": med(turns["mlx_lm.server"], "ratio"),
        "turns": turns,
    }
    meta = {"device": str(mx.default_device()), "shape": args.shape, "dtype": dtype,
            "model": args.model, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
            "rounds": args.rounds, "mlxbun_batch": args.mlxbun_batch, "mlx": mx.__version__,
            "command": " ".join(sys.argv)}
    print(json.dumps(meta))
    print(f"{'conc':>4} {'mlxbun':>9} {'mlx_lm.srv':>10} {'ratio':>6} {'min':>6} "
          f"{'ttft A':>8} {'ttft B':>8} {'fail A/B':>9}")
    for r in table:
        print(f"{r['concurrency']:4d} {r['mlxbun_tps']:9.1f} {r['mlx_lm_server_tps']:10.1f} "
              f"{r['ratio_median']:6.2f} {r['ratio_min']:6.2f} {r['mlxbun_ttft_s']:8.3f} "
              f"{r['mlx_lm_server_ttft_s']:8.3f} "
              f"{r['mlxbun_failed']:4d}/{r['mlx_lm_server_failed']}")
    print(f"mlx-lm generate_step single stream: {summary['mlx_lm_direct_decode_tps']:.1f} tok/s")
    print(f"BatchGenerator(batch {args.batchgen}) {bg} tok/s; mlxbun c={args.batchgen} / it: "
          f"{summary['mlxbun_vs_batchgen']}")
    print(f"second turn TTFT / first: mlxbun {summary['second_turn_ratio_mlxbun']:.3f}, "
          f"mlx_lm.server {summary['second_turn_ratio_mlx_lm_server']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "table": table, "summary": summary,
                       "raw": {k: {str(c): v for c, v in d.items()} for k, d in results.items()},
                       "batchgen": batchgen, "direct": direct}, f, indent=1)


if __name__ == "__main__":
    main()
