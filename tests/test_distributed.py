"""``mlxbun serve --distributed``: two ranks on this machine over MLX's ring backend, started
with ``mlx.launch`` as a user would, against the single-process server.

Greedy output equals the single-process server token for token (tensor parallel on the
tiny llama and qwen3 checkpoints, pipeline parallel on a tiny Qwen3.5 through its family
plugin; float32 so that the changed summation order cannot flip an argmax), streaming and
not, chat and completions, with concurrent requests batched together; the prefix cache hits
across turns; /health and /stats show the group; what a distributed serve cannot do is
refused; SIGTERM on rank 0 stops every rank with status 0; a rank killed mid-stream gives the
client an error frame and rank 0 exits non-zero. One launched pair per setup for the whole
module (a launch costs ~30-60 s here).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.server import free_port, start_server

BIN = Path(sys.executable).parent
BATCH = 64
PROMPTS = ["hello there", "the quick brown fox jumps over", "one two three four five six",
           "a", "seven eight", "what is the time", "zebras and lions", "b c d e f g"]
# 64 short rows decoding together: a decode step's descriptor (their block tables) outgrows
# one frame (channel.FRAME) by the end, up to about 1.2 KB
MANY = [f"{i}: {p} {p} {p}" for i, p in enumerate(PROMPTS * 8)]


def _launcher() -> Path:
    """``mlx.launch``: next to this interpreter, or in the environment MLX is installed in
    (the worktree's venv is layered over another)."""
    import mlx.core as mx

    site = Path(mx.__file__).resolve().parents[1]  # .../lib/python3.X/site-packages
    for candidate in (BIN / "mlx.launch", site.parents[2] / "bin" / "mlx.launch"):
        if candidate.exists():
            return candidate
    raise AssertionError("mlx.launch not found next to the interpreter")


def _ring_ports() -> int:
    """A base port whose next one is free too (the ring listens on base + rank)."""
    for _ in range(50):
        base = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise AssertionError("no two consecutive free ports")


class Pair:
    """Two ranks of ``mlxbun serve --distributed`` under ``mlx.launch`` (ring, loopback)."""

    def __init__(self, ckpt: Path, *extra: str, wait: bool = True, env: dict | None = None):
        self.port = free_port()
        self.mode = "tensor"
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [str(_launcher()), "-n", "2", "--backend", "ring", "-p", str(_ring_ports()),
               "--", str(BIN / "mlxbun"), "serve", str(ckpt), "--distributed",
               "--port", str(self.port), "--no-open", "--batch", str(BATCH),
               "--distributed-timeout", "5", *extra]
        self.proc = ServerProcess(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        if wait:
            self.wait()

    def wait(self) -> None:
        self.proc.wait_for_line("mlxbun: serving", timeout=300)
        self.proc.wait_for_http(self.base + "/health", timeout=60)

    def rank_pid(self, rank: int) -> int:
        """The process of ``rank`` (a child of the launcher, told apart by MLX_RANK)."""
        for child in Path("/proc").iterdir():
            if not child.name.isdigit():
                continue
            try:
                ppid = int((child / "stat").read_text().rsplit(")", 1)[1].split()[1])
                env = (child / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.proc.proc.pid and f"MLX_RANK={rank}".encode() in env:
                return int(child.name)
        raise AssertionError(f"no rank {rank} under the launcher")

    def stop(self) -> None:
        """SIGTERM to rank 0 (a drain that stops every rank), then to the launcher: a
        SIGTERM to mlx.launch alone would leave its ranks running."""
        pids = []
        if self.proc.proc.poll() is None:
            for rank in (0, 1):
                with contextlib.suppress(AssertionError):
                    pids.append(self.rank_pid(rank))
        if pids:
            os.kill(pids[0], signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.proc.wait(30)
        self.proc.stop(timeout=30)
        for pid in pids:  # whatever did not stop (a frozen rank): never leave one running
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)


def _completion(base: str, prompt: str, n: int = 16, stream: bool = False) -> str:
    body = {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0,
            "stream": stream}
    if not stream:
        r = httpx.post(base + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    text = []
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


def _chat(base: str, messages: list, n: int = 16, stream: bool = False) -> tuple[str, dict]:
    body = {"model": "m", "messages": messages, "max_tokens": n, "temperature": 0,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    if not stream:
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        j = r.json()
        return j["choices"][0]["message"]["content"], j["usage"]
    text, usage = [], {}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                j = json.loads(line[6:])
                usage = j.get("usage") or usage
                for c in j.get("choices") or []:
                    text.append(c["delta"].get("content") or "")
    return "".join(text), usage


def _decoded(base: str) -> tuple[float, float]:
    """The batch lane's decode steps and the rows they carried so far (``/metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    got = {s.name: s.value for f in text_string_to_metric_families(
        httpx.get(base + "/metrics").text) for s in f.samples}
    return got["mlxbun_batch_decode_steps_total"], got["mlxbun_batch_decode_rows_total"]


# Qwen3.5 (the qwen35 family plugin) with four layers, so that both pipeline stages keep one
# linear-attention and one full-attention cache each
QWEN35 = {"text_config": {"num_hidden_layers": 4, "full_attention_interval": 2,
                          "layer_types": ["linear_attention", "full_attention"] * 2}}
SETUPS = {"llama": ("llama", {}, ()), "qwen3": ("qwen3", {}, ()),
          "qwen35-pipeline": ("qwen3_5", {"config_overrides": QWEN35}, ("--pipeline",))}


@pytest.fixture(scope="module", params=list(SETUPS))
def served(request):
    """(distributed pair, single-process reference) for one tiny checkpoint: tensor
    parallel on the generic plugin's llama and qwen3, pipeline parallel on Qwen3.5."""
    family, kw, flags = SETUPS[request.param]
    ckpt = tiny_checkpoint(family, dtype="float32", **kw)
    pair = Pair(ckpt, *flags, wait=False)
    pair.mode = "pipeline" if flags else "tensor"
    ref = start_server(ckpt, batch=BATCH)  # while the ranks start
    pair.wait()
    yield pair, f"http://127.0.0.1:{ref.port}"
    ref.stop()
    pair.stop()


def test_greedy_completions_equal_single_process(served):
    pair, ref = served
    for prompt in PROMPTS[:2]:
        want = _completion(ref, prompt)
        assert _completion(pair.base, prompt) == want
        assert _completion(pair.base, prompt, stream=True) == want


def test_greedy_chat_equals_single_process(served):
    pair, ref = served
    messages = [{"role": "user", "content": "tell me a story about cats"}]
    want, _ = _chat(ref, messages)
    assert _chat(pair.base, messages)[0] == want
    assert _chat(pair.base, messages, stream=True)[0] == want


def test_concurrent_requests_batch_together_and_match(served):
    pair, ref = served
    with cf.ThreadPoolExecutor(len(MANY)) as pool:
        want = list(pool.map(lambda p: _completion(ref, p, 32), MANY))
        steps, rows = _decoded(pair.base)
        got = list(pool.map(lambda p: _completion(pair.base, p, 32), MANY))
    assert got == want
    steps_after, rows_after = _decoded(pair.base)
    assert rows_after - rows >= 4 * (steps_after - steps) > 0  # rows shared the steps
    lanes = httpx.get(pair.base + "/stats").json()["batch"]
    assert lanes["cap"] == BATCH


def test_prefix_cache_hits_across_turns(served):
    pair, ref = served
    first = [{"role": "user", "content": "what do cats and dogs eat every day at noon"}]
    _chat(pair.base, first, n=4)
    again, usage = _chat(pair.base, first, n=8, stream=True)  # the next turn re-reads it
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert again == _chat(ref, first, n=8)[0]  # and the cached KV is the right one
    stats = httpx.get(pair.base + "/stats").json()["prompt_cache"]
    assert stats["hits"] >= 1


def test_seeded_requests_run_the_serial_lane_with_mirrored_caches(served):
    """A seeded request runs the serial lane on mlx-lm's own caches, which the followers
    keep in step by replaying what rank 0 does to them through cache_ops.py: made,
    copied into the prefix cache and, for a prompt that leaves the cached one part way,
    copied out and trimmed back to the shared part."""
    pair, ref = served
    story = "The sea and the sky meet at the edge of the world. " * 8  # a hit of 64+

    def seeded(base: str, question: str) -> tuple[str, dict]:
        body = {"model": "m", "prompt": story + question, "max_tokens": 8, "temperature": 0,
                "seed": 11}
        r = httpx.post(base + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"], r.json()["usage"]

    assert seeded(pair.base, "Which birds live there?")[0] == \
        seeded(ref, "Which birds live there?")[0]
    text, usage = seeded(pair.base, "Which fish live there?")
    if pair.mode == "tensor":  # (Qwen3.5's recurrent layers cannot cut back: a miss)
        assert usage["prompt_tokens_details"]["cached_tokens"] > 64
    assert text == seeded(ref, "Which fish live there?")[0]


def test_health_and_stats_show_the_group(served):
    pair, _ = served
    health = httpx.get(pair.base + "/health").json()
    assert health["status"] == "ok"
    group = health["distributed"]
    assert (group["size"], group["backend"], group["mode"]) == (2, "ring", pair.mode)
    assert [r["alive"] for r in group["ranks"]] == [True, True]
    deadline = time.monotonic() + 10
    while httpx.get(pair.base + "/stats").json()["distributed"]["last_ping_ms"] is None:
        assert time.monotonic() < deadline, "no ping answered"
        time.sleep(0.5)


def test_adapter_mount_is_refused_with_400(served):
    pair, _ = served
    r = httpx.post(pair.base + "/v1/adapters", json={"id": "x", "path": "/tmp"})
    assert r.status_code == 400
    assert "--distributed" in r.json()["error"]["message"]


def test_draft_model_is_refused_at_startup():
    ckpt = tiny_checkpoint("llama", dtype="float32")
    pair = Pair(ckpt, "--draft-model", str(ckpt), wait=False)
    try:
        pair.proc.proc.wait(120)  # mlx.launch itself exits 0 whatever its ranks did
    finally:
        pair.stop()
    # every rank refuses it; the first to exit 2 makes the launcher stop the other (-15)
    assert re.search(r"rank [01] exited with code 2", pair.proc.output), pair.proc.output
    assert "exited with code 0" not in pair.proc.output, pair.proc.output
    assert "a draft model (--draft-model) cannot be used with --distributed" in pair.proc.output


def test_mtp_drafts_are_refused_and_prompt_lookup_is_not():
    """The MTP head runs the model's layers outside its call, where the other ranks cannot
    follow: ``--draft-kind mtp`` stops every rank at start-up (exit 2, as
    ``--draft-model`` above). Prompt lookup's drafts ride in the batch's windows, which the
    followers replay: ``--draft-kind ngram`` serves."""
    from mlxbun_core.cli import build_parser
    from mlxbun_core.dist_serve import refusal

    def why(*flags: str) -> str | None:
        return refusal(build_parser().parse_args(["serve", "m", "--distributed", *flags]))

    assert "--draft-kind mtp (--mtp on) cannot be used with --distributed" in (
        why("--draft-kind", "mtp") or "")
    assert why("--draft-kind", "ngram") is None and why() is None


def test_an_out_of_memory_ends_the_group_for_a_restart():
    """``MLXBUN_FAULT_ALLOC=3``: rank 0's third pass runs out of memory. Rank 0 cannot tell
    how far through the pass's collectives it got, so it does not recover in place: the
    request gets a 503 with ``Retry-After`` (in the OpenAI shape), rank 0 exits 75 for its
    supervisor to start the group again, and the follower does not outlive it."""
    pair = Pair(tiny_checkpoint("llama", dtype="float32"), env={"MLXBUN_FAULT_ALLOC": "3"})
    try:
        follower = pair.rank_pid(1)
        r = httpx.post(pair.base + "/v1/completions", timeout=60,
                       json={"model": "m", "prompt": "hello there", "max_tokens": 16,
                             "temperature": 0})
        assert r.status_code == 503, r.text
        assert 1 <= int(r.headers["Retry-After"]) <= 600
        assert "--distributed" in r.json()["error"]["message"]
        pair.proc.proc.wait(60)  # mlx.launch itself exits 0 whatever its ranks did
    finally:
        pair.stop()
    assert "rank 0 exited with code 75" in pair.proc.output, pair.proc.output
    assert not Path(f"/proc/{follower}").exists()


def test_stopping(served, request):
    """Each pair ends differently, last: qwen3's by a follower killed mid-stream (the client's
    stream fails, rank 0 exits non-zero within seconds), the others' by SIGTERM on rank 0
    (a drain that stops every rank, status 0)."""
    pair, _ = served
    if request.node.callspec.id == "qwen3":
        _killed_rank_gives_a_clean_error(pair)
    else:
        _sigterm_stops_every_rank(pair)


def _sigterm_stops_every_rank(pair: Pair) -> None:
    follower = pair.rank_pid(1)
    os.kill(pair.rank_pid(0), signal.SIGTERM)
    pair.proc.proc.wait(60)  # mlx.launch itself exits 0 whatever its ranks did
    assert "exited with code" not in pair.proc.output, pair.proc.output
    assert "was killed" not in pair.proc.output, pair.proc.output
    assert not Path(f"/proc/{follower}").exists()


def _killed_rank_gives_a_clean_error(pair: Pair) -> None:
    frames: list[str] = []
    broken: list[Exception] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": "m", "prompt": "hello", "max_tokens": 4000, "temperature": 0,
                "stream": True}
        try:
            with httpx.stream("POST", pair.base + "/v1/completions", json=body,
                              timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        frames.append(line[6:])
                        if len(frames) >= 3:
                            started.set()
        except httpx.RemoteProtocolError as exc:  # rank 0 went before it wrote the error
            broken.append(exc)

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60), pair.proc.output
    leader = pair.rank_pid(0)
    t0 = time.monotonic()
    os.kill(pair.rank_pid(1), signal.SIGKILL)
    reader.join(30)
    assert not reader.is_alive(), "the stream hung after the rank died"
    errors = [json.loads(f)["error"] for f in frames if f.startswith('{"error"')]
    # the client learns it failed: an error frame from the watchdog, or (when mlx.launch's
    # SIGTERM, sent once rank 1 is gone, reaches rank 0 first) a stream cut short, never a
    # clean end and never a hang
    assert errors or broken, frames[-3:]
    assert not any('"finish_reason":"stop"' in f or '"finish_reason":"length"' in f
                   for f in frames)
    pair.proc.proc.wait(30)
    assert time.monotonic() - t0 < 20
    # 3 from the watchdog; -15 from the launcher; -11 when MLX's ring backend itself crashes
    # on the dead socket ("Too many send/recv errors") before either: never 0, never a hang
    code = re.search(r"rank 0 exited with code (-?\d+)", pair.proc.output)
    assert code and code.group(1) != "0", pair.proc.output
    assert not Path(f"/proc/{leader}").exists()
