"""``--generation-checkpoint N`` across real process deaths: a greedy stream cut off after
~40 tokens, the server killed (SIGKILL) and restarted on the same ``--ssd-cache`` dir, and
the identical request answers with the text of an uninterrupted run, resumed from its
snapshot (the log and ``/stats`` say so); a different request starts over; a completed
generation leaves no snapshot; the flag without ``--ssd-cache`` is refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.gen_checkpoint import FOLDER, FORMAT, CheckpointStore
from mlxbun_core.engine.reply import Reply, gather
from mlxbun_core.kvstore.config import SsdConfig
from mlxbun_core.testing import process
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.turns import engine_reply

EVERY = 8
MAX_TOKENS = 1500  # long enough that the cut-off stream is still running when it is cut
MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea."}]


def serve(ckpt: Path, d: Path, *extra: str) -> tuple[ServerProcess, str]:
    proc = process.serve(ckpt, "--no-open", "--ssd-cache", d, "--generation-checkpoint",
                         EVERY, *extra)
    return proc, proc.base


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)


def stream_text(base: str, messages: list, cut_after: int | None = None) -> tuple[str, int]:
    """A greedy stream's text and its content chunks; ``cut_after``: the client hangs up
    after that many chunks."""
    parts: list[str] = []
    stream = client(base).chat.completions.create(
        model="m", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
            if cut_after is not None and len(parts) >= cut_after:
                stream.close()
                break
    return "".join(parts), len(parts)


def checkpoint_stats(base: str) -> dict:
    return httpx.get(base + "/stats", timeout=30).json()["generation_checkpoint"]


def snapshots(d: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((d / "generations").glob("*.json"))]


def flush(base: str) -> None:
    """The durability boundary: queued KV writes and snapshots are on disk after it."""
    r = httpx.post(base + "/admin/cache/flush", timeout=120)
    assert r.status_code == 200 and r.json()["durable"], r.text


def wait_for(check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_cut_off_stream_resumes_after_a_sigkill_and_restart(tmp_path):
    ckpt = tiny_checkpoint("llama")
    d = tmp_path / "ssd"
    plain = Engine.load(str(ckpt), progress=False, prompt_cache_bytes=0)
    try:
        body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
        reference = engine_reply(plain, body)
    finally:
        close(plain)
    assert reference.finish.reason == "length"  # (the run is long: no early EOS)

    # 1. cut off after ~40 tokens: the cancel keeps the latest snapshot; then SIGKILL
    proc, base = serve(ckpt, d)
    with proc:
        cut, _ = stream_text(base, MESSAGES, cut_after=40)
        assert reference.content.startswith(cut)
        wait_for(lambda: checkpoint_stats(base)["files"] == 1
                 and checkpoint_stats(base)["pending"] == 0)
        # the cancelled row's KV went to the prefix cache; the idle engine writes it behind
        wait_for(lambda: httpx.get(base + "/stats", timeout=30).json()["ssd_cache"]
                 ["pending_snapshots"] == 0)
        ssd = httpx.get(base + "/stats", timeout=30).json()["ssd_cache"]
        proc.proc.kill()
        proc.proc.wait(30)
    [snap] = snapshots(d)
    saved = len(snap["emitted"]) + 1  # (and the next token)
    assert 40 <= saved < MAX_TOKENS
    # on disk: the KV of the prompt and every emitted token (the next one is fed on resume)
    assert ssd["longest_durable_prefix_tokens"] >= snap["prompt_tokens"] + saved - 1

    # 2. restarted on the same dir: a different request (a smaller budget, still past the
    # snapshot) starts over, and completes
    proc, base = serve(ckpt, d)
    with proc:
        r = client(base).chat.completions.create(model="m", messages=MESSAGES,
                                                 max_tokens=MAX_TOKENS - 100, temperature=0)
        assert reference.content.startswith(r.choices[0].message.content)
        assert r.usage.completion_tokens == MAX_TOKENS - 100
        assert checkpoint_stats(base)["resumed"] == 0
        flush(base)
        assert len(snapshots(d)) == 1  # the cut-off one; the completed one left none

        # 3. the identical request resumes from the snapshot: an uninterrupted run's text
        text, _ = stream_text(base, MESSAGES)
        assert text == reference.content
        line = proc.wait_for_line("generation checkpoint: resumed", 30)
        assert int(line.split(" at ")[1].split()[0]) == saved
        stats = checkpoint_stats(base)
        assert stats["resumed"] == 1 and stats["resumed_tokens"] == saved
        flush(base)
        assert snapshots(d) == []  # completed: removed


def test_a_disconnect_resumes_without_a_restart_and_unstreamed(tmp_path):
    ckpt = tiny_checkpoint("llama")
    d = tmp_path / "ssd"
    plain = Engine.load(str(ckpt), progress=False, prompt_cache_bytes=0)
    try:
        body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
        reference = engine_reply(plain, body)
    finally:
        close(plain)
    proc, base = serve(ckpt, d)
    with proc:
        stream_text(base, MESSAGES, cut_after=40)
        wait_for(lambda: checkpoint_stats(base)["files"] == 1)
        r = client(base).chat.completions.create(model="m", messages=MESSAGES,
                                                 max_tokens=MAX_TOKENS, temperature=0)
        assert r.choices[0].message.content == reference.content
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == reference.finish.usage.completion_tokens
        assert r.usage.prompt_tokens == reference.finish.usage.prompt_tokens
        assert checkpoint_stats(base)["resumed"] == 1
        wait_for(lambda: checkpoint_stats(base)["files"] == 0)


def test_the_flag_needs_the_ssd_cache():
    out = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "serve", "whatever",
                          "--generation-checkpoint", "8", "--no-open"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--generation-checkpoint needs --ssd-cache" in out.stderr


def run(engine: Engine, body: dict, cut_after: int | None = None) -> Reply | None:
    """``body`` on ``engine``, gathered; ``cut_after``: the reader leaves after that many
    events (the generation is cancelled)."""
    async def go() -> Reply | None:
        gen = await engine.start(engine.parse_chat(body))
        events = []
        async for ev in gen.events():
            events.append(ev)
            if cut_after is not None and len(events) >= cut_after:
                return None
        return gather(events)

    return asyncio.run(go())


def test_a_seeded_sample_resumes_where_its_random_stream_was(tmp_path):
    """A seeded (temperature 1) generation runs on the serial lane; its resumed run skips
    the random draws of the tokens it replays, so it samples what the first run did."""
    engine = Engine.load(str(tiny_checkpoint("llama")), progress=False,
                         ssd=SsdConfig(dir=tmp_path, checkpoint_every=EVERY))
    try:
        assert engine.checkpoints is not None
        body = {"messages": MESSAGES, "max_tokens": 120, "temperature": 1.0, "seed": 7}
        reference = run(engine, body)
        assert reference is not None and reference.finish.usage.completion_tokens == 120
        run(engine, body, cut_after=20)
        engine.checkpoints.flush(30)
        [snap] = snapshots(tmp_path)
        assert 0 < len(snap["emitted"]) < 119
        resumed = run(engine, body)
        assert resumed is not None and resumed.content == reference.content
        assert resumed.finish.usage.completion_tokens == 120
        assert engine.checkpoints.stats()["resumed"] == 1
        engine.checkpoints.flush(30)
        assert snapshots(tmp_path) == []
    finally:
        close(engine)


def aged(path: Path, seconds: float) -> Path:
    """``path``'s mtime set ``seconds`` into the past (the sweep reads the file's age)."""
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def snapshot_file(d: Path, key: str, tokens: int, age_s: float) -> Path:
    path = d / FOLDER / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, "key": key, "prompt_tokens": 3,
                                "emitted": list(range(tokens)), "next": 1}))
    return aged(path, age_s)


def test_snapshots_past_the_age_limit_are_swept_when_the_store_opens(tmp_path):
    """A cancelled generation nobody retried leaves its snapshot; it expires (and so does a
    temp file a kill left behind), a recent one stays and still resumes."""
    old = snapshot_file(tmp_path, "old", 10, age_s=3 * 3600)
    fresh = snapshot_file(tmp_path, "fresh", 10, age_s=60)
    torn = tmp_path / FOLDER / ".torn.tmp"
    torn.write_text("{")
    aged(torn, 3 * 3600)
    store = CheckpointStore(tmp_path, 8, max_age_s=3600)
    assert not old.exists() and not torn.exists() and fresh.exists()
    assert store.load("fresh", 3) == [*range(10), 1] and store.load("old", 3) is None
    assert store.stats()["expired"] == 2 and store.stats()["files"] == 1


def test_past_the_byte_cap_the_oldest_snapshots_go_first(tmp_path):
    """At open and as new snapshots are written: the oldest leave until the rest fit;
    the one just written always stays."""
    first = snapshot_file(tmp_path, "first", 100, age_s=300)
    second = snapshot_file(tmp_path, "second", 100, age_s=200)
    third = snapshot_file(tmp_path, "third", 100, age_s=100)
    size = third.stat().st_size
    store = CheckpointStore(tmp_path, 8, max_bytes=2 * size + size // 2)
    assert [p.exists() for p in (first, second, third)] == [False, True, True]
    store.save("new", 3, list(range(101)))  # as big as the others: the oldest makes room
    assert store.flush(30)
    assert [p.exists() for p in (second, third, store.path("new"))] == [False, True, True]
    assert sum(p.stat().st_size for p in (tmp_path / FOLDER).glob("*.json")) \
        <= store.max_bytes
    assert store.stats()["expired"] == 2
    store.save("huge", 3, list(range(5000)))  # alone over the cap: kept, the rest go
    assert store.flush(30)
    assert sorted(p.name for p in (tmp_path / FOLDER).iterdir()) == ["huge.json"]
