"""Speculation (prompt lookup, or the checkpoint's MTP head with ``--kind mtp``) against
plain decoding, same engine, same run.

One engine serves every request; each request picks its arm with the per-request field
(``"draft_kind": "ngram"`` / ``"mtp"`` or ``"none"``), and arms alternate A B / B A for
``--rounds`` rounds so background load hits both alike. Workloads (chat requests, real tokenizer):

- ``code``: a Python source file plus "rename this function, give the whole file back";
- ``json``: a JSON document plus "set one field, give the whole document back";
- ``prose``: a short story request, sampled at ``--prose-temperature`` (default 1.0: nothing
  to look up, the overhead case; random weights loop under greedy decoding, sampled they do
  not);
- ``batch8``: ``--clients`` requests at once (code and json alternating) on the batch lane
  (with the median wall time, time to first token and per-row decode tok/s of each arm).

Single-stream rows report decode tok/s (tokens after the first / time after the first)
as a median over the rounds; ``batch8`` reports aggregate tok/s (all completion tokens /
wall time). ``ratio`` is the ratio of the two medians, ``ratio_paired`` the median of each
round's own ratio (the steadier one on a lent machine whose speed drifts between rounds);
``calls_per_token`` the speculative arm's forward passes per token. Greedy arms must
produce identical text; the bench counts mismatches.
Acceptance comes from ``usage.speculation``. Whether a workload echoes depends on the
model: the embedded SmolLM2-135M really copies code and JSON; random-weight shapes
(``--shape``) only repeat themselves (their loops are what lookup catches), so there the
no-lookup row is the informative one and the echo rows are an upper bound.

    python bench/speculation.py                        # embedded SmolLM2-135M, CPU
    python bench/speculation.py --shape tiny           # random tiny llama
    python bench/speculation.py --model /path/to/ckpt  # any checkpoint
    python bench/speculation.py --shape 8b --rounds 5 --max-tokens 256 \\
        --out bench/results/speculation_h200.json      # H200, Llama-3-8B body, bf16

MTP (``--kind mtp``) needs a checkpoint that ships ``mtp.*`` weights: Qwen's own HF
release of a Qwen3.5 model (mlx-lm conversions drop the head). MTP rows decode on the
batch lane with the others (``speculate/mtp_batch.py``), so ``batch8`` is ``--clients``
concurrent MTP requests against the same clients decoding plainly in the batch:

    python bench/speculation.py --kind mtp --model /path/to/Qwen3.5-9B --rounds 5 \\
        --max-tokens 256 --out bench/results/mtp_h200.json
    python bench/speculation.py --kind mtp --model /path/to/Qwen3.5-9B --rounds 6 \\
        --workloads batch8 --clients 8 --max-tokens 256 --vs-serial
        # N MTP clients on the batch lane vs plain batched, and (--vs-serial) vs the same
        # MTP clients on a second engine with --batch 1 (the serial lane: what MTP did
        # before it ran on the batch lane); rounds rotate the three arms' order
    python bench/speculation.py --kind mtp --model /path/to/Qwen3.5-9B \\
        --num-draft-tokens 1 --mtp-hidden post          # depth / hidden-state A/B
    python bench/speculation.py --kind mtp --shape tiny  # plumbing only: tiny Qwen3.5
                                                          # whose head repeats the last token
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import gather

SPEC = "spec"  # the speculative arm (its draft_kind is --kind)
SERIAL = "serial"  # --vs-serial: the speculative arm on a --batch 1 engine

SHAPES = {  # llama bodies with the test tokenizer's vocabulary
    "tiny": {},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}

CODE = '''import json
from dataclasses import dataclass, field


@dataclass
class Order:
    order_id: int
    customer: str
    items: list[str] = field(default_factory=list)
    total: float = 0.0

    def add_item(self, name: str, price: float) -> None:
        self.items.append(name)
        self.total += price

    def to_json(self) -> str:
        return json.dumps({"order_id": self.order_id, "customer": self.customer,
                           "items": self.items, "total": round(self.total, 2)})


def load_orders(path: str) -> list[Order]:
    with open(path) as f:
        rows = json.load(f)
    orders = []
    for row in rows:
        order = Order(row["order_id"], row["customer"])
        for item in row["items"]:
            order.add_item(item["name"], item["price"])
        orders.append(order)
    return orders


def total_revenue(orders: list[Order]) -> float:
    return sum(order.total for order in orders)
'''

RECORDS = [{"id": i, "name": f"task {i}", "owner": ["ana", "ben", "chloe"][i % 3],
            "status": "open", "priority": i % 4} for i in range(1, 13)]


def workloads() -> dict[str, list[dict]]:
    code = (f"Here is a Python file:\n\n```python\n{CODE}```\n\nRename the function "
            "`load_orders` to `read_orders` everywhere. Reply with the complete updated "
            "file only.")
    doc = (f"Here is a JSON document:\n\n{json.dumps(RECORDS, indent=1)}\n\nSet the "
           "\"status\" of the task with id 7 to \"done\". Reply with the complete updated "
           "JSON document only.")
    prose = "Write a short, original story about a lighthouse keeper and a storm."
    return {"code": [{"role": "user", "content": code}],
            "json": [{"role": "user", "content": doc}],
            "prose": [{"role": "user", "content": prose}]}


async def run(engine: Engine, messages: list[dict], kind: str, args,
              temperature: float | None = None) -> dict:
    body = {"messages": messages, "max_tokens": args.max_tokens,
            "draft_kind": args.kind if kind == SPEC else kind,
            "temperature": args.temperature if temperature is None else temperature}
    if kind == SPEC and args.num_draft_tokens:
        body["num_draft_tokens"] = args.num_draft_tokens
    t0 = time.perf_counter()
    gen = await engine.start(engine.parse_chat(body))
    reply = gather([ev async for ev in gen.events()])
    usage, timings = reply.finish.usage, reply.finish.timings
    return {"text": reply.content, "tokens": usage.completion_tokens,
            "decode_tps": timings.get("decode_tps", 0.0), "ttft": timings.get("ttft_s", 0.0),
            "wall": time.perf_counter() - t0, "speculation": usage.speculation}


async def batch(engine: Engine, jobs: list[list[dict]], kind: str, args) -> dict:
    t0 = time.perf_counter()
    out = await asyncio.gather(*[run(engine, m, kind, args) for m in jobs])
    wall = time.perf_counter() - t0
    return {"text": [o["text"] for o in out], "tokens": sum(o["tokens"] for o in out),
            "aggregate_tps": sum(o["tokens"] for o in out) / wall, "wall": wall,
            "ttft": statistics.mean(o["ttft"] for o in out),
            "decode_tps": statistics.mean(o["decode_tps"] for o in out),
            "speculation": [o["speculation"] for o in out]}


def acceptance(specs: list) -> float | None:
    drafted = sum(s["drafted"] for s in specs if s)
    return sum(s["accepted"] for s in specs if s) / drafted if drafted else None


async def bench(engine: Engine, args, serial: Engine | None = None) -> dict:
    loads = workloads()
    names = [n for n in ("code", "json", "prose") if n in args.workloads]
    results: dict[str, dict] = {}
    print("warming up", flush=True)
    await run(engine, loads["prose"], "none", args)  # warm-up (kernels, pacer)
    await run(engine, loads["code"], SPEC, args)
    for name in names:
        rows: dict[str, list] = {SPEC: [], "none": []}
        temp = args.prose_temperature if name == "prose" else None
        for i in range(args.rounds):
            for kind in ((SPEC, "none") if i % 2 == 0 else ("none", SPEC)):
                rows[kind].append(await run(engine, loads[name], kind, args, temp))
        results[name] = summarize(rows, "decode_tps", sampled=bool(temp))
        print(f"{name}: {results[name]['spec']} vs {results[name]['plain']} tok/s", flush=True)
    if "batch8" in args.workloads:
        jobs = [loads["code" if i % 2 == 0 else "json"] for i in range(args.clients)]
        rows = {SPEC: [], "none": [], SERIAL: []}
        arms = [SPEC, "none"] + ([SERIAL] if serial is not None else [])
        if serial is not None:
            await batch(serial, jobs[:1], SPEC, args)  # warm-up
        for kind in (SPEC, "none"):  # warm-up: the batched shapes of either arm
            await batch(engine, jobs, kind, args)
        for i in range(args.rounds):
            for kind in arms[i % len(arms):] + arms[:i % len(arms)]:
                on = serial if kind == SERIAL else engine
                assert on is not None
                rows[kind].append(await batch(on, jobs, SPEC if kind == SERIAL else kind, args))
        results["batch8"] = summarize(rows, "aggregate_tps")
        for key in ("wall", "ttft", "decode_tps"):  # medians: where the time goes
            for arm, name in ((SPEC, "spec"), ("none", "plain")):
                results["batch8"][f"{name}_{key}"] = round(
                    statistics.median(r[key] for r in rows[arm]), 3)
        if serial is not None:
            off = statistics.median(r["aggregate_tps"] for r in rows[SERIAL])
            results["batch8"].update(
                serial=round(off, 1), serial_all=[round(r["aggregate_tps"], 1)
                                                  for r in rows[SERIAL]],
                vs_serial=round(results["batch8"]["spec"] / off, 3),
                serial_mismatches=sum(a["text"] != b["text"]
                                      for a, b in zip(rows[SPEC], rows[SERIAL])))
    return results


def summarize(rows: dict, key: str, sampled: bool = False) -> dict:
    on = statistics.median(r[key] for r in rows[SPEC])
    off = statistics.median(r[key] for r in rows["none"])
    specs = [s for r in rows[SPEC] for s in (r["speculation"] if isinstance(
        r["speculation"], list) else [r["speculation"]])]
    mismatches = None if sampled else sum(a["text"] != b["text"]
                                          for a, b in zip(rows[SPEC], rows["none"]))
    # rounds alternate the arms' order, so a round's own ratio cancels the lent machine's
    # drift (its clocks and neighbours swing single arms by 2x between rounds)
    paired = statistics.median(a[key] / b[key] for a, b in zip(rows[SPEC], rows["none"]))
    calls = sum(s["targetCalls"] for s in specs if s)
    emitted = sum(r["tokens"] for r in rows[SPEC])
    return {"spec": round(on, 1), "plain": round(off, 1), "ratio": round(on / off, 3),
            "ratio_paired": round(paired, 3),
            "calls_per_token": round(calls / emitted, 3) if emitted and calls else None,
            "acceptance": acceptance(specs), "tokens": rows[SPEC][0]["tokens"],
            "spec_all": [round(r[key], 1) for r in rows[SPEC]],
            "plain_all": [round(r[key], 1) for r in rows["none"]],
            "text_mismatches": mismatches}


def model_path(args) -> str | None:
    if args.model or args.shape is None:
        return args.model
    from mlxbun_core.testing.checkpoints import write_checkpoint

    out = Path(tempfile.mkdtemp(prefix="spec-bench-")) / args.shape
    dtype = "float32" if args.shape == "tiny" else "bfloat16"
    if args.kind == "mtp":  # a Qwen3.5 body with the "copy" head (testing/mtp.py)
        if args.shape != "tiny":
            raise SystemExit("--kind mtp: only --shape tiny (or --model with mtp weights)")
        return str(write_checkpoint(out, "qwen3_5", seed=args.seed, dtype=dtype, mtp="copy"))
    return str(write_checkpoint(out, "llama", seed=args.seed, dtype=dtype,
                                config_overrides=SHAPES[args.shape]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="checkpoint path (default: the embedded SmolLM2-135M)")
    p.add_argument("--shape", choices=list(SHAPES), help="random-weight llama body instead")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--prose-temperature", type=float, default=1.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="batch lane rows")
    p.add_argument("--workloads", nargs="+", default=None,
                   help="default: code json prose batch8")
    p.add_argument("--kind", choices=["ngram", "mtp"], default="ngram",
                   help="the speculative arm's draft_kind")
    p.add_argument("--num-draft-tokens", type=int, default=None,
                   help="the speculative arm's depth (default: the kind's own)")
    p.add_argument("--mtp-hidden", choices=["pre", "post"], default=None,
                   help="the target state the MTP head reads (MLXBUN_MTP_HIDDEN)")
    p.add_argument("--vs-serial", action="store_true",
                   help="batch8: also run the speculative arm on a second engine with "
                        "--batch 1 (the serial lane)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    if args.workloads is None:
        args.workloads = ["code", "json", "prose", "batch8"]
    if args.mtp_hidden:  # MLXBUN_MTP_HIDDEN, through the run configuration
        from mlxbun_core import runconfig

        runconfig.install(runconfig.current().changed(families={"mtp_hidden": args.mtp_hidden}))
    path = model_path(args)
    engine = Engine.load(path, progress=False, batch=args.batch, prompt_cache_bytes=0)
    print(f"loaded {path or 'the embedded model'}", flush=True)
    serial = (Engine.load(path, progress=False, batch=1, prompt_cache_bytes=0)
              if args.vs_serial else None)
    try:
        results = asyncio.run(bench(engine, args, serial))
    finally:
        engine.close()
        if serial is not None:
            serial.close()
    report = {"model": path or "embedded SmolLM2-135M", "shape": args.shape,
              "kind": args.kind, "num_draft_tokens": args.num_draft_tokens,
              "mtp_hidden": args.mtp_hidden,
              "rounds": args.rounds, "max_tokens": args.max_tokens,
              "temperature": args.temperature, "prose_temperature": args.prose_temperature,
              "results": results}
    for name, r in results.items():
        unit = "aggregate tok/s" if name == "batch8" else "decode tok/s"
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"{name:7s} {args.kind} {r['spec']:8.1f}  plain {r['plain']:8.1f}  "
              f"ratio {r['ratio']:.3f} (paired {r['ratio_paired']:.3f})  acceptance {acc}  "
              f"calls/token {r['calls_per_token']}  {unit}  "
              f"mismatches {r['text_mismatches']}")
        if name == "batch8":
            print(f"{name:7s} wall {r['spec_wall']:.3f} / {r['plain_wall']:.3f} s, ttft "
                  f"{r['spec_ttft']:.3f} / {r['plain_ttft']:.3f} s, decode "
                  f"{r['spec_decode_tps']:.0f} / {r['plain_decode_tps']:.0f} tok/s a row "
                  f"({args.kind} / plain, medians)")
        if "serial" in r:
            print(f"{name:7s} {args.kind} on the serial lane {r['serial']:8.1f}  "
                  f"batch lane / serial {r['vs_serial']:.3f}  "
                  f"mismatches {r['serial_mismatches']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
