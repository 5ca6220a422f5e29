"""A coding-agent session across a server restart: mlxbun without and with the SSD tier,
against mlx_lm.server, same checkpoint, same run.

Session phase: 20 turns of a growing agent conversation (a long system prompt with tool
descriptions, each turn a tool result the client sends and the model's own reply fed
back), then the server is restarted (mlxbun+ssd: ``POST /admin/cache/flush`` first, then
SIGTERM, as an operator would), then 5 more turns. Reported per arm: per-turn TTFT, wall
time of the 20 turns and of the 5 after the restart, and the ratios against
mlx_lm.server.

Restore phase (mlxbun+ssd): one conversation over a ``--restore-tokens`` history. Turn 1
cold, flush, restart, then the file's page cache is dropped (``posix_fadvise``; Linux) and
the disk's sequential read speed measured on that file, dropped again, and turn 2 is
timed: restore time and bytes from ``/stats``, restore GB/s ÷ disk GB/s, and turn 2's TTFT
against a cold turn 2 (mlxbun without the tier, restarted the same way).

    python bench/agent_session.py                                   # CPU: a small qwen3 shape
    python bench/agent_session.py --shape 8b --restore-tokens 24000 \\
        --ssd-dir /path/on/the/disk --out bench/results/agent_session_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import bench_home  # this folder

SHAPES = {  # qwen3 bodies; "8b" is Qwen3-8B's (36 layers, 8 KV heads: ~147 KB of KV a token)
    "tiny": {},
    "cpu": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8,
            "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}
TOOLS = ["read_file", "write_file", "run_tests", "grep", "list_dir", "git_diff"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process (restartable with the same command)."""

    def __init__(self, name: str, cmd, log_dir: str):
        self.name, self.cmd, self.log_dir = name, cmd, log_dir
        self.proc, self.base, self.starts = None, None, []

    def start(self, env: dict | None = None) -> float:
        bench_home.use()  # a temporary home unless the bench was given --home
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        log_path = os.path.join(self.log_dir, f"{self.name}.{len(self.starts)}.log")
        t0 = time.perf_counter()
        with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.cmd(port), stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})})
        while time.perf_counter() - t0 < 1800:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited {self.proc.returncode}; see {log_path}")
            try:
                if httpx.get(self.base + "/v1/models", timeout=2).status_code == 200:
                    self.starts.append(time.perf_counter() - t0)
                    return self.starts[-1]
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"{self.name} did not start")

    def stop(self) -> float:
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.perf_counter() - t0


def chat(base: str, messages: list, max_tokens: int) -> dict:
    """One streamed greedy turn: TTFT, total time and the reply text."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0, first, text = time.perf_counter(), None, []
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=3600) as r:
        if r.status_code != 200:
            raise SystemExit(f"{base}: HTTP {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = ((json.loads(line[6:]).get("choices") or [{}])[0].get("delta")) or {}
                piece = delta.get("content") or delta.get("reasoning") or ""
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    end = time.perf_counter()
    return {"ttft_s": (first or end) - t0, "total_s": end - t0, "text": "".join(text)}


def words(tok, n: int, rng: random.Random) -> str:
    """Text of about ``n`` tokens (random ids decode to text that re-encodes longer: cut)."""
    ids = [rng.randrange(100, min(tok.vocab_size, 30000)) for _ in range(n)]
    enc = tok.encode(tok.decode(ids), add_special_tokens=False)
    return tok.decode(enc[:n])


def script(tok, turns: int, system_tokens: int, result_tokens: int, seed: int) -> dict:
    """The client's side of the session: the system prompt and each turn's tool result."""
    rng = random.Random(seed)
    tools = "\n".join(f"- {t}(path, args): {words(tok, 40, rng)}" for t in TOOLS)
    system = f"You are a coding agent. Tools:\n{tools}\nRules: {words(tok, system_tokens, rng)}"
    results = [f"<tool_response name=\"{rng.choice(TOOLS)}\">{words(tok, result_tokens, rng)}"
               "</tool_response>" for _ in range(turns)]
    return {"system": system, "task": "Fix the failing test in src/parser.py.",
            "results": results}


def run_session(server: Server, plan: dict, before: int, after: int, max_tokens: int,
                flush: bool) -> dict:
    """``before`` turns, a restart, ``after`` turns; the model's replies are fed back."""
    msgs = [{"role": "system", "content": plan["system"]},
            {"role": "user", "content": plan["task"]}]
    rows, walls = [], {}
    t0 = time.perf_counter()
    for i in range(before + after):
        if i == before:
            walls["before_s"] = time.perf_counter() - t0
            restart = {}
            if flush:
                f0 = time.perf_counter()
                r = httpx.post(server.base + "/admin/cache/flush", timeout=3600)
                restart["flush_s"], restart["flush"] = time.perf_counter() - f0, r.json()
            restart["stop_s"] = server.stop()
            restart["start_s"] = server.start()
            walls["restart"] = restart
            t0 = time.perf_counter()
        turn = chat(server.base, msgs, max_tokens)
        rows.append({k: turn[k] for k in ("ttft_s", "total_s")})
        msgs += [{"role": "assistant", "content": turn["text"] or "(calling a tool)"},
                 {"role": "user", "content": plan["results"][i % len(plan["results"])]}]
        print(f"  {server.name} turn {i + 1}: ttft {turn['ttft_s']:.3f} s, "
              f"total {turn['total_s']:.3f} s", flush=True)
    walls["after_s"] = time.perf_counter() - t0
    stats = _stats(server)
    return {"turns": rows, **walls, "stats": stats}


def _stats(server: Server) -> dict:
    try:
        return httpx.get(server.base + "/stats", timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return {}


def drop_pages(directory: str) -> None:
    advise = getattr(os, "posix_fadvise", None)
    for p in Path(directory).rglob("*.mlxkv"):
        if advise is not None:
            with open(p, "rb") as f:
                advise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def disk_read_gbs(directory: str) -> dict:
    """Sequential read speed of the tier's files with their pages dropped first."""
    files = sorted(Path(directory).rglob("*.mlxkv"), key=lambda p: p.stat().st_size)
    if not files:
        return {}
    path = files[-1]
    drop_pages(directory)
    buf = bytearray(16 << 20)
    t0, n = time.perf_counter(), 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(buf)
            if not got:
                break
            n += got
    dt = time.perf_counter() - t0
    drop_pages(directory)
    return {"file_bytes": n, "read_s": dt, "gbs": n / dt / 1e9}


def run_restore(servers: dict, plan: dict, max_tokens: int, ssd_dir: str) -> dict:
    """Turn 1 over the long history, restart, turn 2: with the tier vs without it."""
    out = {}
    msgs = [{"role": "system", "content": plan["system"]},
            {"role": "user", "content": plan["task"]}]
    for name in ("mlxbun+ssd", "mlxbun"):
        s = servers[name]
        s.start()
        t1 = chat(s.base, msgs, max_tokens)
        follow = msgs + [{"role": "assistant", "content": t1["text"] or "ok"},
                         {"role": "user", "content": plan["results"][0]}]
        row = {"turn1_ttft_s": t1["ttft_s"]}
        if name == "mlxbun+ssd":
            f0 = time.perf_counter()
            row["flush"] = httpx.post(s.base + "/admin/cache/flush", timeout=3600).json()
            row["flush_s"] = time.perf_counter() - f0
        s.stop()
        if name == "mlxbun+ssd":
            row["disk"] = disk_read_gbs(ssd_dir)
            # a restore whatever the rates say (turn 2 from disk, timed), then the check's
            # own choice in a fresh process; killed, so neither adds a file for the other
            row["forced_restore_turn2_ttft_s"] = turn2_killed(s, follow, max_tokens, {
                "MLXBUN_SSD_READ_GBS": "1000000", "MLXBUN_SSD_WRITEBEHIND": "0"})
            drop_pages(ssd_dir)
            s.start({"MLXBUN_SSD_WRITEBEHIND": "0"})
        else:
            s.start()
        t2 = chat(s.base, follow, max_tokens)
        row["turn2_ttft_s"] = t2["ttft_s"]
        st = _stats(s)
        row["prompt_cache"] = st.get("prompt_cache")
        if name == "mlxbun+ssd":
            s.proc.kill()
            s.proc.wait()
            ssd = st.get("ssd_cache") or {}
            row["ssd_cache"] = ssd
            if ssd.get("restore_ms_last"):
                gbs = ssd["restore_bytes_last"] / (ssd["restore_ms_last"] / 1e3) / 1e9
                row["restore_gbs"] = gbs
                if row.get("disk", {}).get("gbs"):
                    row["restore_vs_disk"] = gbs / row["disk"]["gbs"]
        if name != "mlxbun+ssd":
            s.stop()
        out[name] = row
        print(f"  restore {name}: {json.dumps({k: v for k, v in row.items() if k != 'flush'})}",
              flush=True)
    cold2 = out["mlxbun"]["turn2_ttft_s"]
    ssd = out["mlxbun+ssd"]
    out["ssd_turn2_vs_cold"] = ssd["turn2_ttft_s"] / cold2
    cache = ssd.get("prompt_cache") or {}
    restored = bool(cache.get("ssd_hits"))
    out["decision"] = "restored" if restored else "recomputed"
    # right when it took the faster of the two ways measured
    out["decision_right"] = (ssd["forced_restore_turn2_ttft_s"] < cold2) == restored
    return out


def turn2_killed(s: Server, follow: list, max_tokens: int, env: dict) -> float:
    """Turn 2's TTFT on a fresh start with ``env``; the server is then SIGKILLed (no
    shutdown flush), so the tier's files stay as they were."""
    s.start(env)
    ttft = chat(s.base, follow, max_tokens)["ttft_s"]
    s.proc.kill()
    s.proc.wait()
    return ttft


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="cpu", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None, help="a checkpoint dir (default: a random --shape)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--turns", type=int, default=20, help="turns before the restart")
    ap.add_argument("--after", type=int, default=5, help="turns after the restart")
    ap.add_argument("--system-tokens", type=int, default=1200)
    ap.add_argument("--result-tokens", type=int, default=300,
                    help="tokens of each tool result (~8k tokens of history at turn 20)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--restore-tokens", type=int, default=4000,
                    help="history of the restore phase (0: skip it)")
    ap.add_argument("--arms", nargs="*", default=["mlxbun", "mlxbun+ssd", "mlx_lm.server"])
    ap.add_argument("--rounds", type=int, default=1,
                    help="session rounds; the arms' order alternates, medians are reported")
    ap.add_argument("--ssd-dir", default=None, help="where the tier writes (default: a temp dir)")
    ap.add_argument("--out", default=None)
    bench_home.add_flag(ap)
    args = ap.parse_args()
    bench_home.use(args.home)

    import mlx.core as mx
    from mlx_lm import load

    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    ckpt = args.model
    if ckpt is None:
        from mlxbun_core.testing.checkpoints import write_checkpoint

        ckpt = f"/tmp/bench-qwen3-{args.shape}-{dtype}"
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            write_checkpoint(ckpt, "qwen3", seed=11, dtype=dtype,
                             config_overrides=SHAPES[args.shape])
    _, tok = load(str(ckpt))
    ssd_root = args.ssd_dir or tempfile.mkdtemp(prefix="mlxbun-ssd-bench-")
    logs = tempfile.mkdtemp(prefix="agent-session-logs-")

    def mlxbun(extra):
        return lambda port: [sys.executable, "-m", "mlxbun_core.cli", "serve", str(ckpt),
                             "--port", str(port), "--no-open", "--log-level", "warning", *extra]

    def fresh_ssd(tag):
        d = os.path.join(ssd_root, tag)
        shutil.rmtree(d, ignore_errors=True)
        return d

    plan = script(tok, args.turns + args.after, args.system_tokens, args.result_tokens, seed=5)
    session: dict = {name: [] for name in args.arms}
    for rnd in range(args.rounds):
        session_dir = fresh_ssd("session")  # every round starts with an empty tier
        servers = {
            "mlxbun": Server("mlxbun", mlxbun([]), logs),
            "mlxbun+ssd": Server("mlxbun+ssd", mlxbun(["--ssd-cache", session_dir]), logs),
            "mlx_lm.server": Server("mlx_lm.server", lambda port: [
                sys.executable, "-m", "mlx_lm.server", "--model", str(ckpt), "--port", str(port)],
                logs),
        }
        for name in args.arms if rnd % 2 == 0 else list(reversed(args.arms)):
            print(f"session round {rnd}: {name}", flush=True)
            s = servers[name]
            s.start()
            chat(s.base, [{"role": "user", "content": "warm up"}], 4)  # kernels, not measured
            try:
                session[name].append(run_session(s, plan, args.turns, args.after,
                                                 args.max_tokens, flush=name == "mlxbun+ssd"))
            finally:
                s.stop()
    restore = None
    if args.restore_tokens:
        rdir = fresh_ssd("restore")
        rservers = {"mlxbun": Server("mlxbun-r", mlxbun([]), logs),
                    "mlxbun+ssd": Server("mlxbun+ssd-r", mlxbun(["--ssd-cache", rdir]), logs)}
        rplan = script(tok, 1, args.restore_tokens, args.result_tokens, seed=9)
        restore = run_restore(rservers, rplan, 8, rdir)
    report(args, dtype, ckpt, session, restore)


def _row(args, s: dict) -> dict:
    ttft = [t["ttft_s"] for t in s["turns"]]
    after = ttft[args.turns:]
    return {"wall_before_s": s["before_s"], "wall_after_s": s["after_s"],
            "wall_s": s["before_s"] + s["after_s"],
            "ttft_median_before_s": statistics.median(ttft[:args.turns]),
            "ttft_first_after_restart_s": after[0] if after else None,
            "ttft_median_after_s": statistics.median(after) if after else None}


def report(args, dtype, ckpt, session: dict, restore) -> None:
    """Medians over rounds; ratios to mlx_lm.server are per round (same round), then the
    median of those."""
    import mlx.core as mx

    summary = {}
    ref = session.get("mlx_lm.server")
    for name, runs in session.items():
        rows = [_row(args, s) for s in runs]
        row = {k: statistics.median(r[k] for r in rows) if rows[0][k] is not None else None
               for k in rows[0]}
        row["restart"] = [{k: v for k, v in s.get("restart", {}).items() if k != "flush"}
                          for s in runs]
        if ref:
            ratios = [r["wall_s"] / (x["before_s"] + x["after_s"]) for r, x in zip(rows, ref)]
            before = [r["wall_before_s"] / x["before_s"] for r, x in zip(rows, ref)]
            row["wall_vs_mlx_lm_server"] = statistics.median(ratios)
            row["wall_vs_mlx_lm_server_rounds"] = ratios
            row["wall_before_vs_mlx_lm_server"] = statistics.median(before)
        summary[name] = row
    meta = {"device": str(mx.default_device()), "shape": args.shape, "dtype": dtype,
            "model": str(ckpt), "mlx": mx.__version__, "command": " ".join(sys.argv)}
    print(json.dumps(meta))
    print(f"{'arm':>14} {'wall 20':>9} {'wall +5':>9} {'ttft med':>9} {'ttft 1st after':>15} "
          f"{'vs mlx_lm.server':>17}")
    for name, r in summary.items():
        print(f"{name:>14} {r['wall_before_s']:9.2f} {r['wall_after_s']:9.2f} "
              f"{r['ttft_median_before_s']:9.3f} {r['ttft_first_after_restart_s'] or 0:15.3f} "
              f"{r.get('wall_vs_mlx_lm_server', float('nan')):17.3f}")
    if restore:
        ssd = restore["mlxbun+ssd"]
        rates = ssd.get("ssd_cache") or {}
        print(f"restore decision: {restore['decision']} (right: {restore['decision_right']}; "
              f"forced restore {ssd['forced_restore_turn2_ttft_s']:.3f} s, cold "
              f"{restore['mlxbun']['turn2_ttft_s']:.3f} s; seeded restore "
              f"{rates.get('restore_gbs')} GB/s ({rates.get('restore_rate_source')}))")
        print(f"restore: turn 2 after restart {ssd['turn2_ttft_s']:.3f} s with the tier, "
              f"{restore['mlxbun']['turn2_ttft_s']:.3f} s cold "
              f"({restore['ssd_turn2_vs_cold']:.3f}×); "
              f"restore {ssd.get('restore_gbs', 0):.2f} GB/s, "
              f"disk {ssd.get('disk', {}).get('gbs', 0):.2f} GB/s "
              f"({ssd.get('restore_vs_disk', 0):.2f} of it)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "summary": summary, "session": session,
                       "restore": restore}, f, indent=1)


if __name__ == "__main__":
    main()
