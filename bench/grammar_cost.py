"""Per-token decode cost of a JSON-schema reply, with the budget-aware close on and off.

One process, one random-weight llama-shaped checkpoint, mlx-lm's ``generate_step`` at
temperature 1.0, configs alternating request by request (A B C D, A B C D, ...) for
``--rounds`` rounds so machine noise hits all alike:

  plain         no logits processor: the floor
  schema-off    the grammar processor with ``budget_close`` off: what a schema reply cost
                before the budget-aware close
  schema-on     ``budget_close`` on, the server's usual budget (the context room): the
                reply ends long before it, so the close only looks once in a while
  schema-tight  ``budget_close`` on, the budget = the request's length: every request runs
                into it, so the guarded draws and the forced close are all in the timing
                (the worst case; "valid" counts the replies that parse)

Timed: decode steps only (each request's first step, which carries the prefill, is left
out); reported as the median and the 10%-trimmed mean (a shared box has bursts). "host
us/tok" is the time spent inside the processor (matcher, mask, the close's checks).
Requests stop at EOS, when only EOS can follow, or after ``--request-tokens`` steps; a
round goes on until every config has ``--tokens`` timed steps.

    python bench/grammar_cost.py                                   # CPU: tiny llama, 5 rounds
    python bench/grammar_cost.py --shape 8b --dtype bfloat16 --tokens 256 --rounds 5 \\
        --out bench/results/grammar_cost_h200_8b.json              # the H200, 8B shape
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxbun_core.grammar import GrammarRequest
from mlxbun_core.grammar_registry import GrammarRegistry
from mlxbun_core.testing.helpers import parses_json

SHAPES = {  # llama shapes as in bench/serve_overhead.py; the vocab comes from --vocab
    "tiny": {},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}
SCHEMA = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "n", "note"],
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
                   "note": {"type": "string"}}}}
PROMPT = "Write the list as JSON:"
CONTEXT_ROOM = 32768  # a usual server budget: what set_budget gets without max_tokens
CONFIGS = ("plain", "schema-off", "schema-on", "schema-tight")


class Timed:
    """Wraps a processor to time its host-side work."""

    def __init__(self, proc):
        self.proc, self.spent, self.calls = proc, 0.0, 0

    def __call__(self, tokens, logits):
        t = time.perf_counter()
        out = self.proc(tokens, logits)
        self.spent += time.perf_counter() - t
        self.calls += 1
        return out


def processor(reg, tok, config, sampler, request_tokens):
    if config == "plain":
        return None
    proc = reg.plan_request(GrammarRequest("json_schema", SCHEMA), tok).processor
    if proc is None:
        raise SystemExit("the grammar did not compile (a degraded run would time nothing)")
    proc.sampler, proc.close_on_budget = sampler, config != "schema-off"
    proc.set_budget(request_tokens if config == "schema-tight" else CONTEXT_ROOM)
    return Timed(proc)


def one_request(model, tok, proc, sampler, n, times, seed) -> str:
    """Decode one request (<= ``n`` steps); append its decode-step times; return its text."""
    prompt = mx.array(tok.encode(PROMPT))
    mx.random.seed(seed)
    ids, last = [], None
    for (y, _), _ in zip(generate_step(prompt, model, sampler=sampler,
                                       logits_processors=[proc] if proc else None), range(n)):
        now = time.perf_counter()
        if last is not None:
            times.append(now - last)
        last = now
        if y in tok.eos_token_ids:
            break
        ids.append(y)
        if proc is not None and proc.proc.done:
            break
    return tok.decode(ids)


def bench(model, tok, reg, args) -> dict:
    sampler = make_sampler(temp=1.0)
    times = {c: [] for c in CONFIGS}
    host = {c: [0.0, 0] for c in CONFIGS}
    valid = {c: [0, 0] for c in CONFIGS}
    for r in range(args.rounds + 1):  # round 0 warms up (compiles, caches) and is dropped
        got = {c: [] for c in CONFIGS}
        seed = 0
        while min(len(g) for g in got.values()) < args.tokens:
            for config in CONFIGS:  # one request each, in turn, same seed
                if len(got[config]) >= args.tokens:
                    continue
                proc = processor(reg, tok, config, sampler, args.request_tokens)
                text = one_request(model, tok, proc, sampler, args.request_tokens, got[config],
                                   seed)
                if r and proc is not None:
                    host[config][0] += proc.spent
                    host[config][1] += proc.calls
                if r and config == "schema-tight":
                    valid[config][0] += parses_json(text)
                    valid[config][1] += 1
            seed += 1
        if r:
            for config in CONFIGS:
                times[config] += got[config]
    return {"times": times, "host": host, "valid": valid}


def trimmed_mean(xs: list, cut: float = 0.1) -> float:
    xs = sorted(xs)
    k = int(len(xs) * cut)
    return statistics.mean(xs[k:len(xs) - k] if len(xs) > 2 * k else xs)


def report(result: dict, meta: dict) -> dict:
    times, host, valid = result["times"], result["host"], result["valid"]
    base_mean = trimmed_mean(times["plain"])
    base_median = statistics.median(times["plain"])
    off = trimmed_mean(times["schema-off"])
    rows = []
    fmt = "{:<13} {:>9} {:>9} {:>11} {:>13} {:>10} {:>11} {:>7}"
    print(fmt.format("config", "ms/tok", "median", "x plain", "x plain (med)", "x off",
                     "host us/tok", "valid"))
    for c in CONFIGS:  # ms/tok: the 10%-trimmed mean
        m, med = trimmed_mean(times[c]), statistics.median(times[c])
        h = host[c][0] / max(host[c][1], 1) * 1e6
        v = f"{valid[c][0]}/{valid[c][1]}" if valid[c][1] else "-"
        rows.append({"config": c, "ms_per_token": m * 1e3, "median_ms": med * 1e3,
                     "ratio_plain": m / base_mean, "ratio_plain_median": med / base_median,
                     "ratio_off": m / off, "host_us_per_token": h, "valid": v,
                     "steps": len(times[c])})
        print(fmt.format(c, f"{m * 1e3:.3f}", f"{med * 1e3:.3f}", f"{m / base_mean:.3f}x",
                         f"{med / base_median:.3f}x", f"{m / off:.3f}x", f"{h:.0f}", v), flush=True)
    return {"meta": meta, "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--vocab", type=int, default=None,
                    help="model vocab rows (default: 1024 tiny, 8192 otherwise, "
                         "as grammar_overhead)")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--backend", default="llguidance")
    ap.add_argument("--tokens", type=int, default=192,
                    help="timed decode steps per config per round")
    ap.add_argument("--request-tokens", type=int, default=96,
                    help="steps per request (and the tight budget)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default=None, help="a checkpoint dir (default: a random --shape)")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()

    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    vocab = args.vocab or (1024 if args.shape == "tiny" else 8192)
    ckpt = args.model or tiny_checkpoint("llama", vocab_size=vocab,
                                         config_overrides=SHAPES[args.shape], dtype=dtype)
    model, tok = load(str(ckpt))
    if args.model:  # the checkpoint's own vocab, not the --vocab of a random one
        vocab = json.loads((Path(ckpt) / "config.json").read_text())["vocab_size"]
    reg = GrammarRegistry()
    reg.select(args.backend)
    meta = {"device": str(mx.default_device()), "shape": args.shape, "dtype": dtype,
            "vocab": vocab, "tokenizer_vocab": len(tok._tokenizer), "backend": args.backend,
            "tokens": args.tokens, "request_tokens": args.request_tokens, "rounds": args.rounds}
    print(json.dumps(meta), flush=True)
    out = report(bench(model, tok, reg, args), meta)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
