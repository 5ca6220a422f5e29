"""What the server costs on top of mlx-lm: decode tok/s and time to first token, side by side.

For one checkpoint, in one run:
  1. mlx-lm alone, in this process: ``generate_step`` greedy, N tokens (the floor we are
     measured against), and ``BatchGenerator`` with one row (what batching costs a lone
     stream in mlx-lm itself);
  2. mlxbun over real HTTP, each server its own ``mlxbun serve`` process (a client in the
     server's process would contend for its GIL): a streaming /v1/completions request,
     N tokens, same prompt, with the default lanes and with ``--batch 1`` (serial lane),
     and on the default lanes with a 4-token neighbour sent alongside (the stream starts
     batched and goes on alone once the neighbour ends);
  3. mlxbun with a JSON-schema grammar (llguidance) on /v1/chat/completions.
Reports decode tok/s (first token to last), TTFT, the ratio to (1) and end-to-end tok/s (all
tokens over the whole request: the honest figure when a neighbour makes tokens arrive in
bursts). Configs alternate for ``--rounds`` rounds so
background load hits all alike; the median is reported.

    python bench/serve_overhead.py                      # tiny llama (CPU smoke run)
    python bench/serve_overhead.py --shape 1b --dtype bfloat16 --tokens 256 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import httpx
import mlx.core as mx

import bench_home  # this folder

SHAPES = {  # llama-style shapes; the vocab stays small (a test tokenizer), the body is real size
    "tiny": {},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}
SCHEMA = {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                     "required": ["name", "n"],
                                     "properties": {"name": {"type": "string", "maxLength": 12},
                                                    "n": {"type": "integer"}}}}
PROMPT = "Once upon a time, in a city by the sea, there lived"


def mlx_lm_direct(model, tok, n):
    from mlx_lm.generate import generate_step

    prompt = mx.array(tok.encode(PROMPT))
    t0 = time.perf_counter()
    first = None
    count = 0
    for _ in generate_step(prompt, model, max_tokens=n):
        count += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return {"ttft_s": first - t0, "decode_tps": (count - 1) / (end - first), "tokens": count,
            "e2e_tps": count / (end - t0)}


def mlx_lm_batch_one(model, tok, n):
    """mlx-lm's BatchGenerator with one row: what the batch lane costs a lone stream."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, completion_batch_size=8)
    t0 = time.perf_counter()
    gen.insert([tok.encode(PROMPT)], max_tokens=[n])
    first, count = None, 0
    while count < n:
        _, responses = gen.next()
        if responses and first is None:
            first = time.perf_counter()
        count += len(responses)
    end = time.perf_counter()
    gen.close()
    return {"ttft_s": first - t0, "decode_tps": (count - 1) / (end - first), "tokens": count,
            "e2e_tps": count / (end - t0)}


CLIENT = httpx.Client(timeout=600)  # one keep-alive client, as a real application would hold


def over_http(base, path, body, n):
    t0 = time.perf_counter()
    first = None
    with CLIENT.stream("POST", base + path, json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"{path}: HTTP {r.status_code}: {r.read()[:300]!r}")
        if "warning" in r.headers:  # a degraded grammar would time an unconstrained run
            raise SystemExit(f"grammar not enforced: {r.headers['warning']}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            ch = obj["choices"][0]
            piece = ch.get("text") or (ch.get("delta") or {}).get("content")
            if piece and first is None:
                first = time.perf_counter()
            if ch.get("finish_reason"):
                usage = obj["usage"]
    end = time.perf_counter()
    n_tok = usage["completion_tokens"]
    return {"ttft_s": first - t0, "decode_tps": (n_tok - 1) / (end - first), "tokens": n_tok,
            "e2e_tps": n_tok / (end - t0)}


def serve(ckpt, *flags) -> tuple:
    """``mlxbun serve`` on ``ckpt`` in its own process; (process, base URL)."""
    from serve_concurrency import free_port, start  # this folder: the script's own path

    port = free_port()
    log = os.path.join(tempfile.gettempdir(), f"mlxbun-overhead-{port}.log")
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", str(ckpt), "--port", str(port),
           "--no-open", *flags]
    return start(cmd, port, log), f"http://127.0.0.1:{port}/v1"


def with_neighbour(base, body, n):
    """``over_http`` while a short request runs alongside on another connection."""
    short = threading.Thread(target=lambda: httpx.post(base + "/completions", timeout=600, json={
        "prompt": PROMPT, "max_tokens": 4, "temperature": 0}))
    short.start()
    try:
        return over_http(base, "/completions", body, n)
    finally:
        short.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default=None,
                    help="weights dtype (default: float32 on CPU, bfloat16 on GPU)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)

    from mlx_lm import load

    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    t = time.perf_counter()
    ckpt = tiny_checkpoint("llama", config_overrides=SHAPES[args.shape], dtype=dtype)
    build_s = time.perf_counter() - t
    model, tok = load(str(ckpt))
    # fixed-length runs (OpenAI caps a bias at 100)
    eos_ban = {str(i): -100 for i in tok.eos_token_ids}
    procs = {}
    procs["default"], v1 = serve(ckpt)  # default lanes: a lone request runs on the batch lane
    procs["serial"], v1_serial = serve(ckpt, "--batch", "1")
    n = args.tokens
    runs = {
        "mlx_lm.generate_step": lambda: mlx_lm_direct(model, tok, n),
        "mlx_lm BatchGenerator, 1 row": lambda: mlx_lm_batch_one(model, tok, n),
        "mlxbun /v1/completions (stream)": lambda: over_http(v1, "/completions", {
            "prompt": PROMPT, "max_tokens": n, "temperature": 0, "stream": True,
            "logit_bias": eos_ban}, n),
        "mlxbun with a 4-token neighbour": lambda: with_neighbour(v1, {
            "prompt": PROMPT, "max_tokens": n, "temperature": 0, "stream": True,
            "logit_bias": eos_ban}, n),
        "mlxbun --batch 1 (serial lane, stream)": lambda: over_http(v1_serial, "/completions", {
            "prompt": PROMPT, "max_tokens": n, "temperature": 0, "stream": True,
            "logit_bias": eos_ban}, n),
        "mlxbun chat + json_schema grammar": lambda: over_http(v1, "/chat/completions", {
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": n, "temperature": 0,
            "stream": True, "logit_bias": eos_ban,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": SCHEMA, "any_whitespace": False}}}, n),
    }
    results = {k: [] for k in runs}
    for fn in runs.values():  # warm-up: compile kernels, grammar, caches
        fn()
    for _ in range(args.rounds):
        for name, fn in runs.items():
            results[name].append(fn())
    for proc in procs.values():
        proc.terminate()
        proc.wait(timeout=60)
    base = statistics.median(r["decode_tps"] for r in results["mlx_lm.generate_step"])
    table = []
    for name, rs in results.items():
        tps = statistics.median(r["decode_tps"] for r in rs)
        ttft = statistics.median(r["ttft_s"] for r in rs)
        e2e = statistics.median(r["e2e_tps"] for r in rs)
        table.append({"config": name, "decode_tps": round(tps, 1), "ttft_ms": round(ttft * 1e3, 1),
                      "e2e_tps": round(e2e, 1),
                      "ratio_vs_mlx_lm": round(tps / base, 3),
                      "tokens": statistics.median(r["tokens"] for r in rs)})
    meta = {"device": str(mx.default_device()), "shape": args.shape, "dtype": dtype,
            "tokens": n, "rounds": args.rounds, "checkpoint_build_s": round(build_s, 1),
            "mlx": mx.__version__}
    print(json.dumps(meta))
    print(f"{'config':38} {'tok/s':>9} {'TTFT ms':>9} {'ratio':>7} {'e2e tok/s':>10}")
    for row in table:
        print(f"{row['config']:38} {row['decode_tps']:9.1f} {row['ttft_ms']:9.1f} "
              f"{row['ratio_vs_mlx_lm']:7.3f} {row['e2e_tps']:10.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": table}, f, indent=1)


if __name__ == "__main__":
    main()
