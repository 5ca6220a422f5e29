"""Forced-token fill and prefill buckets, A/B in one process (``MLXBUN_FILL``,
``MLXBUN_PREFILL_BUCKETS``).

Part ``fill``: time per reply of a forced tool call and of a 10-field JSON schema reply,
greedy, fill off vs ``strict``, alternating arm order every round (same engine, warm;
``engine.fill.mode`` is flipped between requests). Single-stream on the batch lane's lone
path (``solo``) and the serial lane (``serial``, ``--batch 1``); ``mixed`` runs N JSON
clients beside N plain-text clients on the batch lane (rows with forced runs and rows
without share each step) and reports the wall time of the whole wave and the plain
rows' decode tok/s. Replies are checked identical between arms.

Part ``buckets``: a cold first turn over a ~4k-token history, then a second turn that
hits the prefix cache and prefills only the new tokens, with buckets off vs on; every
round uses a fresh history and a new-token count never run before, so the off arm runs
a new query length each time (what costs 50-77 ms on an H200's first use).

    python bench/fill.py                                   # CPU, tiny checkpoint
    python bench/fill.py --shape 8b --model /tmp/bench-qwen3-8b-bfloat16   # H200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from mlxbun_core import runconfig
from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import Reply, gather
from serve_concurrency import SHAPES

FIELDS = {f"field_{i}": ({"type": "integer", "minimum": 0, "maximum": 99} if i % 4 == 0 else
                         {"type": "boolean"} if i % 4 == 1 else
                         {"enum": ["red", "green", "blue"]} if i % 4 == 2 else
                         {"type": "string", "maxLength": 6}) for i in range(10)}
SCHEMA = {"type": "object", "properties": FIELDS, "required": list(FIELDS),
          "additionalProperties": False}
TOOL = {"name": "create_calendar_event", "description": "Create an event in the calendar",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 8},
            "day": {"enum": ["monday", "tuesday", "wednesday", "thursday", "friday"]},
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            "all_day": {"type": "boolean"}},
            "required": ["title", "day", "hour", "all_day"]}}


def workload(kind: str, ask: str) -> dict:
    msgs = [{"role": "user", "content": ask}]
    if kind == "json10":
        return {"messages": msgs, "max_tokens": 256, "temperature": 0,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "record", "schema": SCHEMA}}}
    if kind == "tool":
        return {"messages": msgs, "max_tokens": 160, "temperature": 0,
                "tools": [{"type": "function", "function": TOOL}],
                "tool_choice": {"type": "function", "function": {"name": TOOL["name"]}}}
    return {"messages": msgs, "max_tokens": 64, "temperature": 0, "ignore_eos": True}


def run(eng: Engine, bodies: list[dict]) -> tuple[list[Reply], float]:
    async def go():
        gens = [await eng.start(eng.parse_chat(b)) for b in bodies]

        async def collect(g):
            return gather([ev async for ev in g.events()])
        return await asyncio.gather(*[collect(g) for g in gens])

    t0 = time.perf_counter()
    out = asyncio.run(go())
    return out, time.perf_counter() - t0


def signature(r: Reply) -> tuple:
    return r.content, [(c.name, c.arguments) for c in r.tool_calls], \
        r.finish.usage.completion_tokens


def fill_part(eng: Engine, lane: str, kinds: list[str], rounds: int, clients: int) -> list:
    rows = []
    for kind in kinds:
        times: dict[str, list[float]] = {"off": [], "strict": []}
        extra: dict[str, list[float]] = {"off": [], "strict": []}
        constrained: dict[str, list[float]] = {"off": [], "strict": []}
        plain_s: dict[str, list[float]] = {"off": [], "strict": []}
        seen: dict[str, tuple] = {}
        injected = tokens = 0
        for rnd in range(rounds + 1):  # round 0 warms both arms (not timed)
            arms = ["off", "strict"] if rnd % 2 == 0 else ["strict", "off"]
            for arm in arms:
                eng.fill.mode = arm
                if lane == "mixed":
                    bodies = [workload(kind, f"Record {i}, round {rnd}.") for i in range(clients)]
                    bodies += [workload("plain", f"Story {i}, round {rnd}:")
                               for i in range(clients)]
                else:
                    bodies = [workload(kind, f"Please, round {rnd}.")]
                replies, dt = run(eng, bodies)
                sig = tuple(signature(r) for r in replies)
                if seen.setdefault(f"{rnd}", sig) != sig:
                    print(f"  !! {kind} round {rnd}: replies differ between arms", flush=True)
                if rnd == 0:
                    continue
                times[arm].append(dt)
                if lane == "mixed":
                    extra[arm].append(statistics.mean(
                        r.finish.timings.get("decode_tps", 0.0) for r in replies[clients:]))
                    constrained[arm].append(statistics.mean(
                        r.finish.timings["total_s"] for r in replies[:clients]))
                    plain_s[arm].append(statistics.mean(
                        r.finish.timings["total_s"] for r in replies[clients:]))
                if arm == "strict":
                    for r in replies[:clients if lane == "mixed" else 1]:
                        f = r.finish.usage.fill_report() if r.finish.usage.fill else {}
                        injected += f.get("injected", 0)
                        tokens += r.finish.usage.completion_tokens
        off, on = statistics.median(times["off"]), statistics.median(times["strict"])
        row = {"part": "fill", "lane": lane, "workload": kind, "rounds": rounds,
               "off_s": round(off, 4), "strict_s": round(on, 4),
               "speedup": round(off / on, 3),
               "per_round": [round(a / b, 3) for a, b in zip(times["off"], times["strict"])],
               "filled_share": round(injected / max(1, tokens), 3),
               "tokens_per_reply": round(tokens / max(1, rounds * (clients if lane == "mixed"
                                                                    else 1)), 1)}
        if lane == "mixed":
            row["plain_rows_tps_off"] = round(statistics.median(extra["off"]), 1)
            row["plain_rows_tps_strict"] = round(statistics.median(extra["strict"]), 1)
            for arm in ("off", "strict"):
                row[f"constrained_reply_s_{arm}"] = round(statistics.median(constrained[arm]), 4)
                row[f"plain_reply_s_{arm}"] = round(statistics.median(plain_s[arm]), 4)
        print(json.dumps(row), flush=True)
        rows.append(row)
    eng.fill.mode = "off"
    return rows


def history(rng: random.Random, words: int) -> str:
    vocab = ("the server streams tokens to the client as soon as they are generated and "
             "a language model predicts the next token from the previous ones while the "
             "cache keeps every earlier turn").split()
    return " ".join(rng.choice(vocab) for _ in range(words))


def buckets(mode: str) -> None:
    """Prefill buckets on or off from here on (the run configuration, read per chunk)."""
    runconfig.install(runconfig.current().changed(engine={"prefill_buckets": mode}))


def buckets_part(eng: Engine, rounds: int, words: int) -> list:
    rng = random.Random(7)
    ttft: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    new_words = iter(range(9, 9 + 7 * (2 * rounds + 2), 7))  # a fresh tail length each turn
    for rnd in range(rounds + 1):
        arms = ["off", "on"] if rnd % 2 == 0 else ["on", "off"]
        for arm in arms:
            buckets(arm)
            first = [{"role": "user", "content": history(rng, words)}]
            body = {"messages": first, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
            (r1,), _ = run(eng, [body])
            second = first + [{"role": "assistant", "content": r1.content},
                              {"role": "user", "content": history(rng, next(new_words))}]
            (r2,), _ = run(eng, [{**body, "messages": second}])
            if rnd:
                ttft[arm].append((r1.finish.timings["ttft_s"], r2.finish.timings["ttft_s"]))
                cached = r2.finish.usage.cached_tokens
    rows = []
    for arm, pairs in ttft.items():
        t1 = statistics.median(p[0] for p in pairs)
        t2 = statistics.median(p[1] for p in pairs)
        row = {"part": "buckets", "buckets": arm, "rounds": rounds,
               "turn1_ttft_ms": round(1e3 * t1, 1), "turn2_ttft_ms": round(1e3 * t2, 1),
               "turn2_over_turn1": round(t2 / t1, 3),
               "turn2_per_round_ms": [round(1e3 * p[1], 1) for p in pairs],
               "prompt_tokens_turn2_cached": cached}
        print(json.dumps(row), flush=True)
        rows.append(row)
    buckets("auto")
    return rows


def checkpoint(args) -> str:
    if args.model and os.path.exists(os.path.join(args.model, "config.json")):
        return args.model
    from mlxbun_core.testing.checkpoints import tiny_checkpoint, write_checkpoint

    if args.model:  # write the --shape there (as bench/h200_session.sh does)
        return str(write_checkpoint(args.model, "qwen3", seed=11, dtype=args.dtype or "bfloat16",
                                    config_overrides=SHAPES[args.shape]))
    return str(tiny_checkpoint("qwen3", seed=11, config_overrides=SHAPES[args.shape],
                               **({"dtype": args.dtype} if args.dtype else {})))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None, help="checkpoint dir (default: random --shape)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--parts", nargs="*", default=["fill", "buckets"])
    ap.add_argument("--lanes", nargs="*", default=["solo", "serial", "mixed"])
    ap.add_argument("--workloads", nargs="*", default=["tool", "json10"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--clients", type=int, default=4, help="JSON (and plain) clients, mixed")
    ap.add_argument("--history-words", type=int, default=1500,
                    help="~4k tokens with the test tokenizer")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = checkpoint(args)
    rows = []
    if "fill" in args.parts:
        for lane in args.lanes:
            batch = 1 if lane == "serial" else 2 * args.clients
            eng = Engine.load(path, progress=False, batch=batch, prompt_cache_bytes=0)
            rows += fill_part(eng, lane, args.workloads, args.rounds, args.clients)
            eng.worker.close()
    if "buckets" in args.parts:
        buckets("on")  # so start-up warms the bucket lengths
        eng = Engine.load(path, progress=False, batch=1, prompt_cache_bytes=8 << 30)
        rows += buckets_part(eng, args.rounds, args.history_words)
        eng.worker.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
