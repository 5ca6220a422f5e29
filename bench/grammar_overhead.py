"""Per-token decode cost of grammar-constrained sampling, per backend.

Runs mlx-lm's ``generate_step`` (temperature 1.0) with and without the grammar
processor and reports mean ms/token over decode steps only (prefill and the
first step of every request excluded; compile time is reported separately).
Requests that finish early are restarted until ``--tokens`` decode steps are timed.

    python bench/grammar_overhead.py                     # tiny + wide random checkpoints
    python bench/grammar_overhead.py --model default     # + the bundled SmolLM2 (49k vocab)
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxbun_core.grammar import GrammarRegistry, GrammarRequest

SCHEMA = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "n", "tags"],
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}}}}}
WORKLOADS = {
    "json_schema": GrammarRequest("json_schema", SCHEMA, False),
    "regex": GrammarRequest("regex", r"([a-z]+ [0-9]{1,4}\. )+"),
}


def checkpoints(args):
    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    out = [("tiny llama h64 v1024", tiny_checkpoint("llama", vocab_size=1024))]
    if not args.quick:
        out.append((f"llama h512 L4 v{args.wide_vocab}", tiny_checkpoint(
            "llama", vocab_size=args.wide_vocab, config_overrides={
                "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64})))
    if args.model:
        from mlxbun_core.models.resolve import resolve_model

        r = resolve_model(None if args.model == "default" else args.model, progress=False)
        out.append((r.model_id, r.path))
    return out


def run(model, tok, processor_factory, n_tokens):
    """Mean seconds per decode step over ``n_tokens`` steps."""
    prompt = mx.array(tok.encode("Write the list:"))
    times, seed = [], 0
    while len(times) < n_tokens:
        mx.random.seed(seed)
        seed += 1
        proc = processor_factory()
        procs = [proc] if proc else None
        last = None
        for (y, _), _ in zip(generate_step(prompt, model, sampler=make_sampler(temp=1.0),
                                           logits_processors=procs), range(n_tokens)):
            now = time.perf_counter()
            if last is not None:
                times.append(now - last)
            last = now
            if y in tok.eos_token_ids or (proc is not None and proc.done) or len(times) >= n_tokens:
                break
    return sum(times) / len(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--wide-vocab", type=int, default=8192)
    ap.add_argument("--model", help="also a real model: 'default' or a path/hub id")
    ap.add_argument("--quick", action="store_true", help="tiny checkpoint only")
    args = ap.parse_args()

    reg = GrammarRegistry()
    backends = reg.available()
    rows = []
    for label, path in checkpoints(args):
        model, tok = load(str(path))
        run(model, tok, lambda: None, 10)                       # warm-up
        base = run(model, tok, lambda: None, args.tokens)
        for be in backends:
            reg.select(be)
            for wl, req in WORKLOADS.items():
                t0 = time.perf_counter()
                reg.compile(req, tok)
                compile_s = time.perf_counter() - t0
                run(model, tok, lambda: reg.plan_request(req, tok).processor, 10)
                t = run(model, tok, lambda: reg.plan_request(req, tok).processor, args.tokens)
                rows.append((label, len(tok._tokenizer), be, wl, base * 1e3, t * 1e3, t / base,
                             compile_s * 1e3))
    hdr = ("checkpoint", "tok vocab", "backend", "workload", "base ms/tok", "grammar ms/tok",
           "ratio", "1st compile ms")
    fmt = "{:<24} {:>9} {:<11} {:<11} {:>11} {:>14} {:>6} {:>14}"
    print(fmt.format(*hdr))
    for r in rows:
        print(fmt.format(r[0], r[1], r[2], r[3], f"{r[4]:.2f}", f"{r[5]:.2f}", f"{r[6]:.2f}x",
                         f"{r[7]:.0f}"))


if __name__ == "__main__":
    main()
