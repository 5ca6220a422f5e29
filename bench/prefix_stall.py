"""A second chat turn after a many-client load: does its first token stall?

Reported on the H200 with the 4-bit Qwen3-8B shape: serve with ``--batch 32``, run rounds of 1,
8 and 32 clients (512-token prompts, 128 new tokens), then a two-turn chat over a 3k-token
history; the second turn's first token took 35-37 s (the same turn without the load before it:
0.2 s). This script replays that sequence against one mlxbun server and records, per phase,
aggregate tok/s and median TTFT, then the chat turns' TTFT. While a turn is slow it samples
the server with ``py-spy dump --native`` (when py-spy is installed), so the stall shows where
it is spent.

    python bench/prefix_stall.py --shape 8b --bits 4 --out bench/results/prefix_stall_h200.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import httpx

import bench_home  # this folder
from serve_concurrency import (
    SHAPES,
    chat_ttft,
    free_port,
    load_phase,
    random_prompt,
    start,
)


def checkpoint(shape: str, bits: int) -> str:
    import mlx.core as mx

    from mlxbun_core.testing.checkpoints import write_checkpoint

    dtype = "float32" if mx.default_device() == mx.cpu else "bfloat16"
    base = f"/tmp/bench-qwen3-{shape}-{dtype}"
    if not os.path.exists(os.path.join(base, "config.json")):
        write_checkpoint(base, "qwen3", seed=11, dtype=dtype, config_overrides=SHAPES[shape])
    return quantized(base, bits)


def quantized(base: str, bits: int) -> str:
    """``base`` converted to ``bits``-bit weights beside it (made once; 0: ``base``)."""
    if not bits:
        return base
    out = f"{base}-q{bits}"
    if not os.path.exists(os.path.join(out, "config.json")):
        from mlx_lm import convert

        convert(base, out, quantize=True, q_bits=bits, q_group_size=64)
    return out


class Sampler:
    """py-spy dumps of ``pid`` every ``every`` s after ``after`` s, until stopped."""

    def __init__(self, pid: int, after: float = 3.0, every: float = 4.0):
        self.pid, self.after, self.every = pid, after, every
        self.dumps: list = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def _run(self):
        spy = shutil.which("py-spy")
        if spy is None or self._stop.wait(self.after):
            return
        while not self._stop.is_set():
            t = time.perf_counter()
            out = subprocess.run([spy, "dump", "--native", "--pid", str(self.pid)],
                                 capture_output=True, text=True, timeout=60)
            self.dumps.append({"t": t, "out": out.stdout[-20000:], "err": out.stderr[-2000:]})
            if self._stop.wait(self.every):
                return


async def two_turns(base: str, history: str, rng: random.Random, pid: int) -> dict:
    async with httpx.AsyncClient(timeout=1800) as c:
        msgs = [{"role": "system", "content": history},
                {"role": "user", "content": f"Question {rng.random()}: summarise the above."}]
        t1, reply = await chat_ttft(c, base, msgs, 32)
        msgs += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "And in one word?"}]
        with Sampler(pid) as s:
            t2, _ = await chat_ttft(c, base, msgs, 8)
        t3, _ = await chat_ttft(c, base, msgs, 8)  # the same second turn again
    return {"first_ttft_s": t1, "second_ttft_s": t2, "second_again_s": t3, "dumps": s.dumps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--bits", type=int, default=0, help="quantize the weights (0: keep the dtype)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--history-tokens", type=int, default=3000)
    ap.add_argument("--chats", type=int, default=2, help="two-turn chats after the load")
    ap.add_argument("--serve-args", default="", help="extra mlxbun serve arguments")
    ap.add_argument("--out", default=None)
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)

    ckpt = checkpoint(args.shape, args.bits)
    from pathlib import Path

    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(Path(ckpt))
    rng = random.Random(3)
    prompts = [random_prompt(tok, args.prompt_tokens, rng)
               for _ in range(2 * max(args.concurrency or [1]))]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env_log = "/tmp/bench-prefix-stall.log"
    os.environ["MLXBUN_P2R_TRACE"] = "1"
    proc = start([sys.executable, "-m", "mlxbun_core.cli", "serve", ckpt, "--port", str(port),
                  "--batch", str(args.batch), "--no-open", *args.serve_args.split()],
                 port, env_log)
    phases, chats = [], []
    try:
        asyncio.run(load_phase(base, 2, 1, prompts[:2], 8))  # warm-up
        for rnd in range(args.rounds):
            for conc in args.concurrency:
                res = asyncio.run(load_phase(base, conc, 2, prompts, args.max_tokens))
                phases.append({"round": rnd, "concurrency": conc, **res})
                print(f"round {rnd} c={conc}: {res['aggregate_tps']:.1f} tok/s, ttft median "
                      f"{res['ttft_median_s']:.3f} s, failed {res['failed']}", flush=True)
        for i in range(args.chats):
            history = random_prompt(tok, args.history_tokens, random.Random(100 + i))
            pair = asyncio.run(two_turns(base, history, random.Random(i), proc.pid))
            chats.append(pair)
            print(f"chat {i}: turn 1 {pair['first_ttft_s']:.3f} s, turn 2 "
                  f"{pair['second_ttft_s']:.3f} s, again {pair['second_again_s']:.3f} s, "
                  f"{len(pair['dumps'])} dumps", flush=True)
    finally:
        proc.terminate()
        proc.wait(120)
    with open(env_log) as f:
        trace = [line for line in f if line.startswith("{")][-40:]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "phases": phases, "chats": chats, "trace": trace}, f,
                      indent=1)
    for pair in chats:
        for d in pair["dumps"][:3]:
            print(d["out"][:6000], d["err"][:500])


if __name__ == "__main__":
    main()
