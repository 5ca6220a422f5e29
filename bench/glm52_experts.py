"""GLM-5.2 routed experts streamed from disk: decode tok/s and hit rate per expert budget.

Writes a small random GLM-5.2 checkpoint (default: hidden 256, 1 dense + 5 MoE layers of
32 experts, top-4, float32: 393 KiB per expert, 63 MiB of experts), then for each budget
(a fraction of all routed-expert bytes) loads it through the glm52 plugin with
``expert_budget`` and runs a greedy decode with mlx-lm's ``generate_step``. The fully
resident model is the baseline; every streamed run must produce its tokens.

    .venv/bin/python bench/glm52_experts.py                    # CPU, a couple of minutes
    .venv/bin/python bench/glm52_experts.py --hidden 2048 --moe 1024 --experts 64 \\
        --dtype bfloat16 --tokens 128 --cold                   # on a GPU box (H200)

``--cold`` drops the checkpoint from the page cache (posix_fadvise DONTNEED) before each
run, so first reads come from the disk; later re-reads of an evicted expert may still hit
the page cache. Random weights route almost uniformly, so the hit rate here is close to
the budget fraction; real checkpoints route with skew and hit more often.
Knobs read at load: MLXBUN_EXPERT_READERS (read threads, 4), MLXBUN_EXPERT_PREFETCH (1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def build(args: argparse.Namespace) -> Path:
    from mlxbun_core.testing.checkpoints import write_checkpoint

    out = Path(args.dir or tempfile.mkdtemp(prefix="glm52-bench-")) / "ckpt"
    if (out / "config.json").exists():
        return out
    return write_checkpoint(out, "glm_moe_dsa", seed=11, dtype=args.dtype, config_overrides={
        "hidden_size": args.hidden, "intermediate_size": 2 * args.hidden,
        "moe_intermediate_size": args.moe, "n_routed_experts": args.experts,
        "num_experts_per_tok": args.top_k, "num_hidden_layers": args.layers})


def drop_page_cache(path: Path) -> None:
    for f in path.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def decode(model, tokens: int) -> tuple[list[int], float, float]:
    """Greedy tokens, prefill seconds (first token) and decode tok/s after it."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = mx.array(list(range(5, 37)))
    out, t0, first = [], time.perf_counter(), 0.0
    for tok, _ in generate_step(prompt, model, max_tokens=tokens):
        out.append(int(tok))
        if len(out) == 1:
            first = time.perf_counter()
    end = time.perf_counter()
    return out, first - t0, (len(out) - 1) / (end - first)


COUNTERS = ("hits", "misses", "evictions", "bytes_read", "split_steps", "read_wait_seconds")


def counters(m) -> dict:
    streaming = m.extras.get("expert_streaming")
    if streaming is None:
        return {}
    snap = streaming.cache.snapshot()
    return {**{k: snap[k] for k in COUNTERS},
            **{f"prefetch_{k}": v for k, v in snap["prefetch"].items()}}


def delta(after: dict, before: dict, tokens: int) -> dict:
    d = {k: round(v - before.get(k, 0), 4) for k, v in after.items()}
    if d:
        asked = d["hits"] + d["misses"]
        d["hit_rate"] = round(d["hits"] / asked, 3) if asked else None
        d["mib_read_per_token"] = round(d["bytes_read"] / 2**20 / tokens, 3)
    return d


def load(ckpt: Path, budget: int | None, prefetch: bool = True):
    from mlxbun_core import loader, runconfig
    from mlxbun_core.model import LoadOptions

    # MLXBUN_EXPERT_PREFETCH, read at load from the run configuration
    runconfig.install(runconfig.current().changed(families={"expert_prefetch": prefetch}))
    return loader.claim(ckpt, LoadOptions(model_id="bench", extra={"expert_budget": budget}))


def measure(configs: list[dict], ckpt: Path, args: argparse.Namespace) -> None:
    """Each config loads and runs one pass that fills its cache from disk (cold); then
    ``--repeat`` rounds run every config once in turn (warm), so all configs share the
    machine's noise; warm tok/s is the median, counters are summed over the warm rounds."""
    for c in configs:
        if args.cold:
            drop_page_cache(ckpt)
        c["model"] = load(ckpt, c["budget_bytes"], c.get("prefetch", True))
        tokens, prefill_s, tps = decode(c["model"].model, args.tokens)
        c["tokens"], c["cold"] = tokens, {"prefill_s": round(prefill_s, 3),
                                          "decode_tps": round(tps, 2),
                                          **delta(counters(c["model"]), {}, len(tokens))}
        c["_before"], c["_tps"] = counters(c["model"]), []
    for _ in range(args.repeat):
        for c in configs:
            c["_tps"].append(decode(c["model"].model, args.tokens)[2])
    for c in configs:
        c["warm"] = {"decode_tps": round(statistics.median(c["_tps"]), 2),
                     **delta(counters(c["model"]), c["_before"], args.repeat * args.tokens)}
        if (streaming := c["model"].extras.get("expert_streaming")) is not None:
            streaming.cache.close()
        for k in ("model", "_before", "_tps"):
            c.pop(k)


def report(c: dict, base: dict) -> None:
    for phase in ("cold", "warm"):
        r = c[phase]
        line = (f"{c['name']:<22} {phase}  {r['decode_tps']:7.2f} tok/s "
                f"({r['decode_tps'] / base[phase]['decode_tps']:.2f}x)")
        if "hit_rate" in r:
            line += (f"  hit rate {r['hit_rate']:.3f}  {r['mib_read_per_token']:6.2f} MiB/token"
                     f"  wait {r['read_wait_seconds']:.2f}s  prefetch used/wasted "
                     f"{r['prefetch_used']}/{r['prefetch_wasted']}  split {r['split_steps']}")
        print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--moe", type=int, default=128, help="moe_intermediate_size")
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--layers", type=int, default=6, help="1 dense + (layers - 1) MoE")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--fractions", default="1.0,0.5,0.25,0.1")
    p.add_argument("--repeat", type=int, default=5, help="warm rounds (median tok/s)")
    p.add_argument("--cold", action="store_true")
    p.add_argument("--dir", default=None, help="reuse/keep the checkpoint here")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()

    from mlxbun_glm52.experts import ExpertIndex

    ckpt = build(args)
    index = ExpertIndex.scan(ckpt)
    total = sum(index.expert_bytes(k) for k in index.parts)
    one = max(index.expert_bytes(k) for k in index.parts)
    print(f"checkpoint {ckpt}: {len(index.parts)} routed experts, {total / 2**20:.1f} MiB "
          f"({one / 2**10:.0f} KiB each), {index.disk_bytes / 2**20:.1f} MiB on disk")
    configs: list[dict] = [{"name": "resident", "budget_bytes": None}]
    for frac in (float(f) for f in args.fractions.split(",")):
        budget = max(one, int(total * frac))
        configs.append({"name": f"budget {frac:.2f} ({budget / 2**20:.1f} MiB)",
                        "fraction": frac, "budget_bytes": budget})
        if frac == 0.25:
            configs.append({**configs[-1], "name": configs[-1]["name"] + " no-pf",
                            "prefetch": False})
    measure(configs, ckpt, args)
    for c in configs:
        report(c, configs[0])
        if c["tokens"] != configs[0]["tokens"]:
            raise SystemExit(f"{c['name']}: streamed tokens differ from the resident model")
    print("tokens equal to the resident model in every configuration")
    if args.json:
        rows = [{k: v for k, v in c.items() if k != "tokens"} for c in configs]
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
