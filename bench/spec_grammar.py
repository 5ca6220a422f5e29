"""Speculation on constrained requests (issue #36 item 3): prompt-lookup drafts under the
grammar against forced-token fill, same engine, same run.

Two request kinds, greedy, each with an earlier example in the prompt for the lookup to
find (as ``tests/test_spec_grammar.py`` sets them up): a forced tool call
(``tool_choice`` names the function) and a 10-field JSON schema. Four arms per kind,
picked per request (``draft_kind`` and ``engine.fill.mode``, flipped between requests):

- ``neither``: fill off, ``draft_kind: none`` (plain constrained decoding);
- ``fill``: ``--fill strict`` (forced runs ride with the sampled token), no drafts;
- ``ngram``: fill off, ``draft_kind: ngram`` (drafts checked against the matcher);
- ``both``: fill strict and ``draft_kind: ngram``: combined (``speculate/guided.py``):
  forced runs filled and free choices drafted in one verify window. The row's
  ``both_took`` says what ran (tokens injected by fill / a ``usage.speculation`` block).

A third kind, ``words`` (free words under a regex, ``[a-z ]{20,200}`` and a full stop,
on which the tiny model falls into a loop the lookup predicts), shows the combination
where drafts land between forced runs; the tool call and the schema have nearly nothing free the
lookup guesses.

Lanes: ``serial`` (``--batch 1``) and ``solo`` (``--batch 8``, one request at a time: the
batch lane's lone-stream path). One warm-up round, then ``--rounds`` rounds; the arms'
order rotates every round. Per arm: median wall time per reply, tok/s (completion
tokens / wall), forward passes per reply (every call of the model, counted in-process,
the prompt's prefill chunk included), and same-run ratios of wall time against
``neither`` and against ``fill`` (median of each round's own ratio). Every arm's reply is
compared with the ``neither`` arm's of the same round: content and tool calls must be
equal; the completion-token count may differ by one (the EOS a speculating stream samples).

    python bench/spec_grammar.py --rounds 6 --out bench/results/spec_grammar_cpu_combined.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import Reply, gather

ARMS = ["neither", "fill", "ngram", "both"]
SETTINGS = {"neither": ("off", "none"), "fill": ("strict", "none"),
            "ngram": ("off", "ngram"), "both": ("strict", "ngram")}

FIELDS = {f"field_{i}": ({"type": "integer", "minimum": 0, "maximum": 9} if i % 3 == 0 else
                         {"type": "boolean"} if i % 3 == 1 else
                         {"enum": ["red", "green", "blue"]}) for i in range(10)}
SCHEMA = {"type": "object", "properties": FIELDS, "required": list(FIELDS),
          "additionalProperties": False}
EXAMPLE = json.dumps({k: (3 if i % 3 == 0 else True if i % 3 == 1 else "red")
                      for i, k in enumerate(FIELDS)})
WEATHER = {"name": "get_weather", "description": "Weather forecast for a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 8},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"]}}


def body(kind: str) -> dict:
    """The request of ``kind`` (its prompt carries an earlier record to look up)."""
    if kind == "json10":
        ask = f"Like this one: {EXAMPLE} {EXAMPLE} Give me a record."
        return {"messages": [{"role": "user", "content": ask}], "max_tokens": 160,
                "temperature": 0, "response_format": {
                    "type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}}
    if kind == "words":
        return {"messages": [{"role": "user", "content": "Codes: ab ab ab ab ab"}],
                "max_tokens": 60, "temperature": 0, "guided_regex": r"[a-z ]{20,200}\."}
    ask = ('Weather in Paris? {"city": "Paris", "unit": "celsius"} '
           '{"city": "Paris", "unit": "celsius"}')
    return {"messages": [{"role": "user", "content": ask}], "max_tokens": 80, "temperature": 0,
            "tools": [{"type": "function", "function": WEATHER}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


class Forwards:
    """Counts every call of the model's class (the lanes all call ``model(...)``)."""

    def __init__(self, module: Any) -> None:
        self.calls = 0
        cls = type(module)
        original = cls.__call__

        def counted(inner: Any, *a: Any, **kw: Any) -> Any:
            self.calls += 1
            return original(inner, *a, **kw)
        cls.__call__ = counted


def one(eng: Engine, arm: str, kind: str, forwards: Forwards) -> dict:
    mode, draft = SETTINGS[arm]
    eng.fill.mode = mode
    req = {**body(kind), "draft_kind": draft}

    async def go() -> Reply:
        gen = await eng.start(eng.parse_chat(req))
        return gather([ev async for ev in gen.events()])

    before = forwards.calls
    t0 = time.perf_counter()
    reply = asyncio.run(go())
    wall = time.perf_counter() - t0
    usage = reply.finish.usage
    return {"wall": wall, "tokens": usage.completion_tokens, "forwards": forwards.calls - before,
            "content": reply.content,
            "calls": [(c.name, c.arguments) for c in reply.tool_calls],
            "finish": reply.finish.reason, "spec": usage.speculation,
            "fill": usage.fill_report() if usage.fill else None}


def differs(a: dict, b: dict) -> str | None:
    """Why reply ``b`` is not ``a`` (None: the same reply)."""
    if (a["content"], a["calls"], a["finish"]) != (b["content"], b["calls"], b["finish"]):
        return "text"
    if abs(a["tokens"] - b["tokens"]) > 1:
        return "tokens"
    return None


def lane_kind(eng: Engine, lane: str, kind: str, rounds: int, forwards: Forwards) -> dict:
    got: dict[str, list[dict]] = {a: [] for a in ARMS}
    mismatches: dict[str, list[str]] = {a: [] for a in ARMS[1:]}
    for rnd in range(rounds + 1):  # round 0 warms every arm (not timed)
        order = ARMS[rnd % 4:] + ARMS[:rnd % 4]
        out = {arm: one(eng, arm, kind, forwards) for arm in order}
        for arm in ARMS[1:]:
            why = differs(out["neither"], out[arm])
            if why:
                mismatches[arm].append(f"round {rnd}: {why}")
                print(f"  !! {lane} {kind} {arm} round {rnd}: {why} differs from neither",
                      flush=True)
        if rnd:
            for arm in ARMS:
                got[arm].append(out[arm])
    return summarize(lane, kind, got, mismatches)


def summarize(lane: str, kind: str, got: dict[str, list[dict]],
              mismatches: dict[str, list[str]]) -> dict:
    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in got[arm])

    def paired(arm: str, base: str) -> float:  # a round's own ratio: base wall / arm wall
        return statistics.median(b["wall"] / a["wall"] for a, b in zip(got[arm], got[base]))

    arms = {}
    for arm in ARMS:
        specs = [r["spec"] for r in got[arm] if r["spec"]]
        fills = [r["fill"] for r in got[arm] if r["fill"] and r["fill"].get("injected")]
        drafted = sum(s["drafted"] for s in specs)
        arms[arm] = {
            "wall_ms": round(1e3 * med(arm, "wall"), 2),
            "tok_s": round(statistics.median(r["tokens"] / r["wall"] for r in got[arm]), 1),
            "tokens": got[arm][0]["tokens"], "forwards": med(arm, "forwards"),
            "speedup_vs_neither": round(paired(arm, "neither"), 3),
            "speedup_vs_fill": round(paired(arm, "fill"), 3),
            "wall_ms_all": [round(1e3 * r["wall"], 1) for r in got[arm]],
            "speculated": len(specs), "filled": len(fills),
            "acceptance": round(sum(s["accepted"] for s in specs) / drafted, 3)
            if drafted else None,
            "target_calls": statistics.median(s["targetCalls"] for s in specs) if specs else None,
            "injected": statistics.median(f["injected"] for f in fills) if fills else None,
            "mismatches": mismatches.get(arm, [])}
    took = ("fill" if arms["both"]["filled"] else "") + \
        ("+ngram" if arms["both"]["speculated"] else "")
    row = {"lane": lane, "kind": kind, "rounds": len(got["neither"]),
           "both_took": took.strip("+") or "neither", "arms": arms}
    print(json.dumps({k: v for k, v in row.items() if k != "arms"}), flush=True)
    for arm, a in arms.items():
        print(f"  {arm:8s} {a['wall_ms']:8.1f} ms  {a['tok_s']:7.1f} tok/s  "
              f"{a['tokens']:3d} tok  {a['forwards']:5.1f} fwd  "
              f"x{a['speedup_vs_neither']:.3f} vs neither  x{a['speedup_vs_fill']:.3f} vs fill  "
              f"acc {a['acceptance']}  mismatches {len(a['mismatches'])}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint dir (default: tiny llama, f32)")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--lanes", nargs="*", default=["serial", "solo"])
    ap.add_argument("--kinds", nargs="*", default=["tool", "json10", "words"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    path = args.model or str(tiny_checkpoint("llama", seed=args.seed, dtype=args.dtype))
    load_before = os.getloadavg()
    rows = []
    forwards: Forwards | None = None
    for lane in args.lanes:
        eng = Engine.load(path, progress=False, batch=1 if lane == "serial" else 8,
                          prompt_cache_bytes=0)
        forwards = forwards or Forwards(eng.model.model)
        try:
            rows += [lane_kind(eng, lane, kind, args.rounds, forwards) for kind in args.kinds]
        finally:
            eng.worker.close()
    report = {"args": vars(args), "model": args.model or f"tiny llama seed {args.seed}",
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "cpus": os.cpu_count(), "rows": rows}
    print(f"load average before {load_before}, after {report['loadavg_after']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
