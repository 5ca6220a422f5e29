"""``mlxbun bench`` (``benchmark``): this stack's prefill and decode speed on one model,
in-process (the engine ``serve`` runs, no HTTP), greedy, the median of ``--runs``; each
result is a row of the eval DB that ``mlxbun evals`` lists.

A run sends a raw prompt of about ``--prompt-tokens`` tokens and decodes up to ``--tokens``.
TTFT is the time to the first streamed token (the prefill and one decode step); prefill
tok/s is the prompt over TTFT; decode tok/s counts the tokens after the first over the time
after it. A run that stops early (an end-of-sequence token) counts what it made. Peak memory is
MLX's peak over the timed runs, or the process's peak RSS where MLX tracks none (its CPU
backend). KV bytes per token is measured, not billed: the prompt prefilled once more through
the serial lane's own quantizing model, the bytes its caches hold over the tokens they hold
(so a ``--kv-quant`` scheme that left a layer in its dtype shows in the figure).

``--compiled-activations off`` runs without ``mx.compile`` (an A/B against a run without the
flag); ``--compiled-decode``, ``--fused-sdpa`` and ``--compiled-activations on`` are refused
with the reason ``serve`` gives (:mod:`mlxbun_core.serve_switches`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from ..serve_flags import add_kv_quant_flag, add_selection_flags
from . import evaldb, evals_run
from .measure import commit_label, load_engine
from .oneshot import verb_parser

FILLER = "The quick brown fox jumps over the lazy dog while the band plays on. "


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = verb_parser(sub, "bench", aliases=["benchmark"],
                    help="prefill and decode speed of this stack on a local model "
                         "(in-process, greedy); recorded for `mlxbun evals`")
    b.add_argument("positional", nargs="?", default=None, metavar="model")
    add_selection_flags(b)
    b.add_argument("--tokens", type=int, default=128, help="tokens decoded per run (128)")
    b.add_argument("--runs", type=int, default=3, help="runs; the median is reported (3)")
    b.add_argument("--prompt-tokens", type=int, default=512,
                   help="pad the prompt to about this many tokens (512)")
    add_kv_quant_flag(b, default="off")
    b.add_argument("--compiled-activations", choices=("on", "off"), default=None,
                   help="off: run without mx.compile, an A/B against a run without the flag")
    for flag in ("--compiled-decode", "--fused-sdpa"):
        b.add_argument(flag, choices=("on", "off"), default=None,
                       help="refused, with the reason serve gives (docs/spec-rows.md)")
    b.add_argument("--json", action="store_true", help="the result as one JSON object")
    b.set_defaults(handler=cmd_bench)
    e = sub.add_parser("evals", help="the recorded bench runs and task scores (newest "
                                     "first); `evals run MODEL` scores a model on tasks")
    e.add_argument("--limit", type=int, default=20)
    e.add_argument("--raw", action="store_true", help="JSON lines")
    e.add_argument("--clear", action="store_true",
                   help="move the DB to a timestamped backup and start fresh")
    e.set_defaults(handler=cmd_evals)
    evals_run.add_parser(e)


def cmd_bench(args: argparse.Namespace) -> int:
    from ..errors import APIError
    from ..kvquant.probe import KVQuantUnavailable
    from ..models.paths import mlxbun_home
    from ..models.resolve import ModelNotFound
    from ..selection import chosen_model, report_selection_error, resolve
    from ..serve_switches import apply_switches, refusals

    if args.tokens < 1 or args.runs < 1 or args.prompt_tokens < 1:
        print("mlxbun bench: --tokens, --runs and --prompt-tokens must be at least 1",
              file=sys.stderr)
        return 2
    if said := refusals(args):
        print("\n".join(f"mlxbun bench: {why}" for why in said), file=sys.stderr)
        return 2
    try:
        resolved = resolve(chosen_model(args), progress=False)
    except ModelNotFound as exc:
        return report_selection_error(exc)
    switches = ", ".join(apply_switches(args))
    try:
        row = asyncio.run(_bench(str(resolved.path), resolved.model_id, args))
    except KVQuantUnavailable as exc:
        print(f"mlxbun bench: {exc}", file=sys.stderr)
        return 2
    except APIError as exc:
        print(f"mlxbun bench: {exc.message}", file=sys.stderr)
        return 1
    row["switches"] = switches
    evaldb.record(mlxbun_home(), row)
    print(json.dumps(row) if args.json else
          f"{row['model']}: prompt {row['prompt_tokens']} tokens, {row['decode_tokens']} "
          f"decoded, median of {row['runs']}: prefill {row['prefill_tps']:.1f} tok/s, "
          f"decode {row['decode_tps']:.1f} tok/s, TTFT {row['ttft_ms']:.0f} ms, peak "
          f"{row['peak_bytes'] / 2**20:.0f} MiB, KV {row['kv_bytes_per_token']:.0f} B/token "
          f"({row['kv']}{'; ' + switches if switches else ''})")
    return 0


async def _bench(path: str, model_id: str, args: argparse.Namespace) -> dict[str, Any]:
    import mlx.core as mx

    engine = load_engine(path, model_id, args.kv_quant)
    try:
        prompt = _prompt(engine, args.prompt_tokens)
        await _one(engine, prompt, 2)  # warm-up: first-call compiles and allocations
        mx.reset_peak_memory()
        runs = [await _one(engine, prompt, args.tokens) for _ in range(args.runs)]
        peak = mx.get_peak_memory() or _max_rss()  # the CPU backend tracks none
        kv_per_token = engine.worker.run_sync(lambda: kv_bytes_per_token(engine, prompt))
    finally:
        engine.close()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {"at": time.time(), "stack": "mlxbun", "model": model_id, "bench": "decode",
            "kv": args.kv_quant, "prompt_tokens": int(med["prompt_tokens"]),
            "decode_tokens": int(med["decode_tokens"]), "runs": len(runs),
            "prefill_tps": med["prefill_tps"], "decode_tps": med["decode_tps"],
            "ttft_ms": med["ttft_ms"], "peak_bytes": int(peak),
            "kv_bytes_per_token": kv_per_token, "commit": commit_label()}


def kv_bytes_per_token(engine: Any, prompt: str, chunk: int = 256) -> float:
    """The KV bytes one token costs under the engine's scheme, measured: ``prompt``
    prefilled through the quantizing model the serial lane runs (worker thread only), the
    bytes its caches hold for their positions over the positions."""
    import mlx.core as mx

    from .. import cache_ops, kvquant

    model = engine.model.model
    tokens = list(engine.model.tokenizer.encode(prompt))
    cache = cache_ops.make(model)
    quantizing = kvquant.quantizing(model, engine.kv)
    for i in range(0, len(tokens), chunk):
        quantizing(mx.array(tokens[i:i + chunk])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return sum(_held_bytes(c) for c in cache) / len(tokens)


def _held_bytes(cache: Any) -> int:
    """What one layer's cache holds for its positions (grown buffers cut to the offset);
    0 for state that has no per-position keys (recurrent layers)."""
    keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
    if keys is None or values is None:
        return 0
    parts = [*(keys if isinstance(keys, (tuple, list)) else [keys]),
             *(values if isinstance(values, (tuple, list)) else [values])]
    held = min(int(cache.offset), parts[0].shape[2])  # a window holds no more than its size
    return sum(int(p.nbytes) * held // p.shape[2] for p in parts)


def _prompt(engine: Any, tokens: int) -> str:
    """Filler text of about ``tokens`` tokens under the model's own tokenizer."""
    per = max(1, len(engine.model.tokenizer.encode(FILLER)))
    return FILLER * max(1, -(-tokens // per))


async def _one(engine: Any, prompt: str, tokens: int) -> dict[str, float]:
    from ..events import Content, Done

    req = engine.parse_completion({"prompt": prompt, "max_tokens": tokens, "temperature": 0})
    t0 = time.perf_counter()
    gen = await engine.start(req)
    first = end = None
    finish = None
    async for ev in gen.events():
        if isinstance(ev, Content) and first is None:
            first = time.perf_counter()
        elif isinstance(ev, Done):
            finish, end = ev.finish, time.perf_counter()
    if finish is None or finish.failed or end is None:
        raise RuntimeError(f"the run failed: {finish.error if finish else 'no result'}")
    usage = finish.usage
    ttft = (first or end) - t0
    made = usage.completion_tokens
    return {"prompt_tokens": usage.prompt_tokens, "decode_tokens": made,
            "ttft_ms": ttft * 1000, "prefill_tps": usage.prompt_tokens / ttft,
            "decode_tps": (made - 1) / (end - first) if first and made > 1 and end > first
            else 0.0}


def _max_rss() -> int:
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def cmd_evals(args: argparse.Namespace) -> int:
    from ..models.paths import mlxbun_home

    home = mlxbun_home()
    if args.clear:
        backup = evaldb.clear(home)
        print(f"mlxbun: evals archived to {backup}" if backup else "mlxbun: no evals yet")
        return 0
    rows, scores = evaldb.rows(home, args.limit), evaldb.scores(home, args.limit)
    if args.raw:
        for r in [*rows, *scores]:
            print(json.dumps(r))
        return 0
    if not rows and not scores:
        print("mlxbun: no evals yet (run `mlxbun bench MODEL` or `mlxbun evals run MODEL`)")
        return 0
    if rows:
        _print_runs(rows)
    if scores:
        evaldb.print_scores(scores)
    return 0


def _print_runs(rows: list[dict[str, Any]]) -> None:
    print(f"{'when':<16} {'stack':<7} {'model':<32} {'bench':<7} {'KV':<11} {'prefill':>9} "
          f"{'decode':>8} {'TTFT':>8} {'peak':>8} {'KV/token':>9}  commit")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["at"]))
        print(f"{when:<16} {r['stack']:<7} {r['model'][-32:]:<32} {r['bench']:<7} "
              f"{r['kv'][:11]:<11} {r['prefill_tps']:>7.1f}/s {r['decode_tps']:>6.1f}/s "
              f"{r['ttft_ms']:>6.0f}ms {r['peak_bytes'] / 2**20:>6.0f}Mi "
              f"{_per_token(r.get('kv_bytes_per_token')):>9}  {r['commit']}")


def _per_token(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} B"
