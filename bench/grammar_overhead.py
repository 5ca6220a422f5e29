"""Per-token decode cost of grammar-constrained sampling, per backend.

Runs mlx-lm's ``generate_step`` (temperature 1.0) with and without the grammar
processor and reports mean ms/token over decode steps only (prefill and the
first step of every request excluded; compile time is reported separately).
Requests that finish early are restarted until ``--tokens`` decode steps are timed;
configs run round-robin so background load hits all alike. "host us/tok" is the
time spent inside the processor call (matcher consume + mask fill), the part that
does not overlap with the model's compute.

    python bench/grammar_overhead.py                     # tiny + wide random checkpoints
    python bench/grammar_overhead.py --model default     # + the bundled SmolLM2 (49k vocab)
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxbun_core.grammar import GrammarRequest
from mlxbun_core.grammar_registry import GrammarRegistry

SCHEMA = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "n", "tags"],
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}}}}}
WORKLOADS = {
    "json_schema": GrammarRequest("json_schema", SCHEMA, "compact"),
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
    for shape in args.shape:
        hidden, layers = (int(x) for x in shape.split("x"))
        out.append((f"llama h{hidden} L{layers} v{args.wide_vocab}", tiny_checkpoint(
            "llama", vocab_size=args.wide_vocab, config_overrides={
                "hidden_size": hidden, "intermediate_size": 4 * hidden,
                "num_hidden_layers": layers, "num_attention_heads": hidden // 64,
                "num_key_value_heads": max(1, hidden // 256), "head_dim": 64})))
    if args.model:
        from mlxbun_core.selection import resolve  # a query matches the local library

        r = resolve(None if args.model == "default" else args.model, progress=False)
        out.append((r.model_id, r.path))
    return out


class Timed:
    """Wraps a processor to also time its host-side work (consume + mask fill)."""

    def __init__(self, proc):
        self.proc, self.spent, self.calls = proc, 0.0, 0

    def __call__(self, tokens, logits):
        t = time.perf_counter()
        out = self.proc(tokens, logits)
        self.spent += time.perf_counter() - t
        self.calls += 1
        return out


def one_request(model, tok, proc, n, times, seed):
    """Append the decode-step times of one request (<= n steps) to ``times``."""
    prompt = mx.array(tok.encode("Write the list:"))
    mx.random.seed(seed)
    last = None
    for (y, _), _ in zip(generate_step(prompt, model, sampler=make_sampler(temp=1.0),
                                       logits_processors=[proc] if proc else None), range(n + 1)):
        now = time.perf_counter()
        if last is not None:
            times.append(now - last)
        last = now
        if y in tok.eos_token_ids or (proc is not None and proc.proc.done):
            break


def bench(model, tok, reg, backends, n_tokens, rounds):
    """Round-robin over configs so machine noise hits all of them alike."""
    configs = [("-", "-", None)] + [(be, wl, req) for be in backends
                                    for wl, req in WORKLOADS.items()]
    compile_ms = {}
    for be, wl, req in configs[1:]:
        reg.select(be)
        t0 = time.perf_counter()
        reg.compile(req, tok)
        compile_ms[be, wl] = (time.perf_counter() - t0) * 1e3
    times = {c[:2]: [] for c in configs}
    host = {c[:2]: [0.0, 0] for c in configs}
    per_round = max(1, n_tokens // rounds)
    for r in range(rounds + 1):                                  # round 0 = warm-up
        for be, wl, req in configs:
            t = times[be, wl] if r else []
            while len(t) < per_round * max(r, 1):
                proc = None
                if req is not None:
                    reg.select(be)
                    proc = Timed(reg.plan_request(req, tok).processor)
                one_request(model, tok, proc, per_round, t, seed=len(t))
                if proc and r:
                    host[be, wl][0] += proc.spent
                    host[be, wl][1] += proc.calls
    base = statistics.mean(times["-", "-"])
    rows = []
    for be, wl, _ in configs[1:]:
        m = statistics.mean(times[be, wl])
        h = host[be, wl]
        rows.append((be, wl, base * 1e3, m * 1e3, m / base,
                     statistics.median(times[be, wl]) / statistics.median(times["-", "-"]),
                     h[0] / max(h[1], 1) * 1e6, compile_ms[be, wl]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200, help="timed decode steps per config")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--wide-vocab", type=int, default=8192)
    ap.add_argument("--model", help="also a real model: 'default' or a path/hub id")
    ap.add_argument("--quick", action="store_true", help="tiny checkpoint only")
    ap.add_argument("--shape", action="append", default=[],
                    help="extra llama shape HIDDENxLAYERS (e.g. 2048x16) with the wide vocab")
    args = ap.parse_args()

    reg = GrammarRegistry()
    backends = reg.available()
    hdr = ("checkpoint", "tok vocab", "backend", "workload", "base ms/tok", "grammar ms/tok",
           "ratio", "median ratio", "host us/tok", "compile ms")
    fmt = "{:<24} {:>9} {:<11} {:<11} {:>11} {:>14} {:>6} {:>12} {:>11} {:>10}"
    print(fmt.format(*hdr), flush=True)
    for label, path in checkpoints(args):
        model, tok = load(str(path))
        for r in bench(model, tok, reg, backends, args.tokens, args.rounds):
            print(fmt.format(label, len(tok._tokenizer), r[0], r[1], f"{r[2]:.2f}", f"{r[3]:.2f}",
                             f"{r[4]:.2f}x", f"{r[5]:.2f}x", f"{r[6]:.0f}", f"{r[7]:.0f}"),
                  flush=True)


if __name__ == "__main__":
    main()
