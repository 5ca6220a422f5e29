"""Prompt caching honoured under RAM pressure: an agent session with Anthropic
``cache_control`` breakpoints vs the same session without them (issue #36 item 1).

A 20-turn agent session through the official ``anthropic`` SDK against a real ``mlxbun
serve`` subprocess: a long system prompt and six tools, each turn the model's reply fed
back and a tool result added. Between turns, "other" traffic (``--others`` random prompts
of about ``--other-tokens`` tokens, another tenant's) goes through the same server. The
``--prompt-cache`` byte cap is calibrated to hold the pinned prefix plus about 1.5 other
prompts, so LRU eviction takes the session's own unpinned entry before the next turn.

Arms (``--arms``): ``on`` marks the system prompt with ``cache_control`` (ephemeral, 5
minutes; the template renders the tools before it, so one pin holds both); ``rolling``
marks it too and, as Claude Code does, the last message of each turn (a new breakpoint
every turn, the previous turn's dropped); ``off`` sends the same bodies without any.
Each arm a fresh server, the order rotating by round. Per arm: hit rate
from usage (``cache_read_input_tokens`` / prompt tokens) and from the ``X-Mlxbun-Cache``
header (hit / prompt), median and total time to first token over the 20 turns, the
session's wall time (turns only) and the wall time with the other traffic; each arm ÷ off
per round, then the median of those (and rolling ÷ on).

    python bench/prompt_caching.py --rounds 5 --out bench/results/prompt_caching_cpu.json
    python bench/prompt_caching.py --arms on,rolling,off --rounds 5 \
        --out bench/results/prompt_caching_rolling_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

import anthropic
import httpx

sys.path.insert(0, os.path.dirname(__file__))
import bench_home  # this folder
from agent_session import TOOLS, Server, words

SHAPES = {  # qwen3 bodies, float32 on the CPU
    "tiny": {},
    "small": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64},
}
# Anthropic's cache order: the tools, the system prompt, then the conversation (the tiny
# checkpoints' default template renders no tools). One breakpoint, on the system prompt,
# as Claude Code marks it: it pins the tools and the system prompt as one prefix.
TEMPLATE = (
    "{%- if messages[0].role == 'system' or tools %}<|im_start|>system\n"
    "{%- if tools %}# Tools\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n{% endif %}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if m.role != 'system' %}"
    "{{- '<|im_start|>' + m.role + '\n' + (m.content or '') + '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
EPHEMERAL = {"type": "ephemeral"}


def session_plan(tok, turns: int, system_tokens: int, result_tokens: int, seed: int) -> dict:
    """The agent's side: a long system prompt, six tools, each turn's tool result."""
    rng = random.Random(seed)
    tools = [{"name": t, "description": words(tok, 60, rng),
              "input_schema": {"type": "object", "properties": {
                  "path": {"type": "string"}, "args": {"type": "string"}}}} for t in TOOLS]
    system = f"You are a coding agent. Rules: {words(tok, system_tokens, rng)}"
    results = [f"<tool_response name=\"{rng.choice(TOOLS)}\">{words(tok, result_tokens, rng)}"
               "</tool_response>" for _ in range(turns)]
    return {"system": system, "tools": tools, "task": "Fix the failing test in src/parser.py.",
            "results": results}


def body(plan: dict, messages: list, arm: str, max_tokens: int) -> dict:
    """One turn's request as ``arm`` marks it: ``on``, a breakpoint on the system prompt
    (tools + system); ``rolling``, one on the last message as well; ``off``, none."""
    system: list[dict] = [{"type": "text", "text": plan["system"]}]
    if arm != "off":
        system[0]["cache_control"] = EPHEMERAL
    if arm == "rolling":
        last = messages[-1]
        messages = messages[:-1] + [{**last, "content": [
            {"type": "text", "text": last["content"], "cache_control": EPHEMERAL}]}]
    return {"model": "bench", "max_tokens": max_tokens, "extra_body": {"temperature": 0},
            "system": system, "tools": plan["tools"], "messages": messages}


def turn(client: anthropic.Anthropic, req: dict) -> dict:
    """One streamed turn: TTFT (first content delta), usage, the header, the reply."""
    t0, first, text, usage = time.perf_counter(), None, [], {}
    stream = client.messages.create(**req, stream=True)
    header = stream.response.headers.get("x-mlxbun-cache", "")
    for ev in stream:
        if ev.type == "message_start":
            usage = ev.message.usage.model_dump()
        elif ev.type == "content_block_delta":
            first = first or time.perf_counter()
            text.append(getattr(ev.delta, "text", "") or "")
    end = time.perf_counter()
    hit = header.split(";")[0].removeprefix("hit=").split("/") if "hit=" in header else None
    prompt = (usage.get("input_tokens", 0) + (usage.get("cache_read_input_tokens") or 0)
              + (usage.get("cache_creation_input_tokens") or 0))
    return {"ttft_s": (first or end) - t0, "total_s": end - t0, "text": "".join(text),
            "prompt_tokens": prompt, "cache_read": usage.get("cache_read_input_tokens") or 0,
            "cache_creation": usage.get("cache_creation_input_tokens") or 0,
            "header": header, "header_hit": int(hit[0]) if hit else 0,
            "header_prompt": int(hit[1]) if hit else 0}


def other(client: anthropic.Anthropic, tok, tokens: int, rng: random.Random) -> int:
    """Another tenant's request: a random prompt, one token back; its prompt's length."""
    raw = client.messages.with_raw_response.create(
        model="bench", max_tokens=1, extra_body={"temperature": 0},
        system=words(tok, tokens // 2, rng),
        messages=[{"role": "user", "content": words(tok, tokens // 2, rng)}])
    return int(raw.headers.get("x-mlxbun-cache", "hit=0/0").split(";")[0].split("/")[1])


def run_arm(server: Server, tok, plan: dict, arm: str, args, seed: int) -> dict:
    client = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0,
                                 timeout=3600)
    client.messages.create(model="bench", max_tokens=2,  # kernels, not measured
                           messages=[{"role": "user", "content": "warm up"}])
    rng = random.Random(seed)  # the same other traffic in both arms of a round
    msgs: list[dict] = [{"role": "user", "content": plan["task"]}]
    rows, load0 = [], os.getloadavg()
    t0, in_turns = time.perf_counter(), 0.0
    for i in range(args.turns):
        t = turn(client, body(plan, msgs, arm, args.max_tokens))
        in_turns += t["total_s"]
        rows.append({k: v for k, v in t.items() if k != "text"})
        msgs += [{"role": "assistant", "content": t["text"] or "(calling a tool)"},
                 {"role": "user", "content": plan["results"][i]}]
        print(f"  turn {i + 1}: ttft {t['ttft_s']:.3f} s, read {t['cache_read']}/"
              f"{t['prompt_tokens']}, {t['header']}", flush=True)
        for _ in range(args.others):
            other(client, tok, args.other_tokens, rng)
    wall = time.perf_counter() - t0
    stats = httpx.get(server.base + "/stats", timeout=30).json().get("prompt_cache", {})
    stats.pop("recent", None)
    return {"turns": rows, "wall_s": wall, "session_wall_s": in_turns,
            "loadavg_start": load0, "loadavg_end": os.getloadavg(), "prompt_cache": stats}


def calibrate(ckpt: str, tok, plan: dict, args, logs: str) -> tuple[float, float]:
    """KV bytes per cached token and the pinned prefix's bytes, read off ``/stats`` after
    one other prompt and one marked first turn (on a server with room for everything)."""
    s = Server("calibrate", mlxbun_cmd(ckpt, 8), logs)
    s.start()
    try:
        client = anthropic.Anthropic(base_url=s.base, api_key="x", max_retries=0)
        n = other(client, tok, args.other_tokens, random.Random(1))
        one = _settled(s, 1)
        t = turn(client, body(plan, [{"role": "user", "content": plan["task"]}], "on",
                              args.max_tokens))
        per_token = one / max(1, n)
        session = per_token * (t["prompt_tokens"] + args.max_tokens)
        return per_token, _settled(s, 3) - one - session
    finally:
        s.stop()


def _settled(s: Server, entries: int) -> int:
    """The cache's bytes once it holds ``entries`` entries (they land after the response)."""
    for _ in range(200):
        st = httpx.get(s.base + "/stats", timeout=30).json()["prompt_cache"]
        if st["entries"] >= entries:
            return int(st["bytes"])
        time.sleep(0.05)
    raise SystemExit(f"the cache never held {entries} entries: {st}")


def mlxbun_cmd(ckpt: str, cache_gib: float):
    return lambda port: [sys.executable, "-m", "mlxbun_core.cli", "serve", ckpt,
                         "--port", str(port), "--no-open", "--log-level", "warning",
                         "--prompt-cache", f"{cache_gib:.9f}"]


def summarize(runs: list[dict]) -> dict:
    """Per run: hit rates, TTFT median and total, walls; then medians over rounds."""
    rows = []
    for r in runs:
        t = r["turns"]
        prompt = sum(x["prompt_tokens"] for x in t)
        rows.append({
            "hit_rate_usage": sum(x["cache_read"] for x in t) / prompt,
            "hit_rate_header": (sum(x["header_hit"] for x in t)
                                / max(1, sum(x["header_prompt"] for x in t))),
            "hit_rate_header_after_turn1": (sum(x["header_hit"] for x in t[1:])
                                            / max(1, sum(x["header_prompt"] for x in t[1:]))),
            "ttft_median_s": statistics.median(x["ttft_s"] for x in t),
            "ttft_total_s": sum(x["ttft_s"] for x in t),
            "session_wall_s": r["session_wall_s"], "wall_s": r["wall_s"]})
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["rounds"] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="small", choices=sorted(SHAPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--system-tokens", type=int, default=1200)
    ap.add_argument("--result-tokens", type=int, default=120)
    ap.add_argument("--others", type=int, default=2, help="other prompts between turns")
    ap.add_argument("--other-tokens", type=int, default=1000)
    ap.add_argument("--cap-others", type=float, default=1.5,
                    help="the byte cap: the pinned prefix plus this many other prompts")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--arms", default="on,off", help="comma-separated: on, rolling, off")
    ap.add_argument("--out", default=None)
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)

    import hashlib

    from mlx_lm import load

    from mlxbun_core.testing.checkpoints import write_checkpoint

    tag = hashlib.sha256(TEMPLATE.encode()).hexdigest()[:8]  # a new template, a new dir
    ckpt = f"/tmp/bench-pc-qwen3-{args.shape}-{tag}"
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        write_checkpoint(ckpt, "qwen3", seed=11, dtype="float32", chat_template=TEMPLATE,
                         config_overrides=SHAPES[args.shape])
    _, tok = load(ckpt)
    logs = tempfile.mkdtemp(prefix="prompt-caching-logs-")
    plan = session_plan(tok, args.turns, args.system_tokens, args.result_tokens, seed=5)
    per_token, pinned_bytes = calibrate(ckpt, tok, plan, args, logs)
    cap_bytes = pinned_bytes + per_token * args.cap_others * args.other_tokens
    print(f"KV {per_token:.0f} B/token; pinned {pinned_bytes / 1e6:.2f} MB; cap "
          f"{cap_bytes / 1e6:.2f} MB (pinned + {args.cap_others} × {args.other_tokens} tokens)",
          flush=True)
    names = args.arms.split(",")
    arms: dict[str, list] = {name: [] for name in names}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            print(f"round {rnd}: breakpoints {name} (load {os.getloadavg()[0]:.2f})", flush=True)
            s = Server(f"{name}{rnd}", mlxbun_cmd(ckpt, cap_bytes / 2**30), logs)
            s.start()
            try:
                arms[name].append(run_arm(s, tok, plan, name, args, seed=100 + rnd))
            finally:
                s.stop()
    report(args, ckpt, per_token, pinned_bytes, cap_bytes, arms)


def report(args, ckpt: str, per_token: float, pinned_bytes: float, cap_bytes: float,
           arms: dict) -> None:
    import mlx.core as mx

    summary = {name: summarize(runs) for name, runs in arms.items()}
    pairs = [(a, "off") for a in summary if a != "off" and "off" in summary]
    if "rolling" in summary and "on" in summary:
        pairs.append(("rolling", "on"))
    ratios: dict[str, dict] = {}
    for a, b in pairs:
        for key in ("ttft_median_s", "ttft_total_s", "session_wall_s", "wall_s"):
            per_round = [x[key] / y[key] for x, y in
                         zip(summary[a]["rounds"], summary[b]["rounds"])]
            ratios.setdefault(f"{a}_vs_{b}", {})[key] = {
                "median": statistics.median(per_round), "rounds": per_round}
    meta = {"device": str(mx.default_device()), "shape": args.shape, "model": ckpt,
            "mlx": mx.__version__, "anthropic": anthropic.__version__,
            "kv_bytes_per_token": per_token, "pinned_bytes": pinned_bytes,
            "prompt_cache_bytes": cap_bytes,
            "loadavg_end": os.getloadavg(), "command": " ".join(sys.argv), "args": vars(args)}
    print(json.dumps(meta))
    print(f"{'arm':>7} {'hit usage':>10} {'hit header':>11} {'ttft med':>9} {'ttft sum':>9} "
          f"{'turns wall':>11} {'wall':>8}")
    for name, r in summary.items():
        print(f"{name:>7} {r['hit_rate_usage']:10.3f} {r['hit_rate_header']:11.3f} "
              f"{r['ttft_median_s']:9.3f} {r['ttft_total_s']:9.2f} "
              f"{r['session_wall_s']:11.2f} {r['wall_s']:8.2f}")
    for pair, by_key in ratios.items():
        print(f"{pair.replace('_vs_', ' ÷ ')} (median of same-round ratios): "
              + ", ".join(f"{k} {v['median']:.3f}" for k, v in by_key.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "summary": summary, "ratios": ratios, "arms": arms},
                      f, indent=1)


if __name__ == "__main__":
    main()
