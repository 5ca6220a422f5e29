"""The SSD tier across real process deaths: SIGTERM flushes before exit; SIGKILL of a
server right after a reply (its write-behind running) and of a writer process at many
random points mid-write never leaves anything that is served corrupt; every restarted
server answers as a cold one would."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import mlx.core as mx

from mlxbun_core.engine.core import Engine
from mlxbun_core.kvstore.config import SsdConfig
from mlxbun_core.kvstore.fileformat import SUFFIX, TMP_PREFIX, CorruptEntry, read_header
from mlxbun_core.kvstore.store import SsdStore
from mlxbun_core.testing import process
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.turns import SYSTEM, cold, ids, next_turn, turn

USER = {"role": "user", "content": "Tell me about the sea and the sky. " * 12}


def serve(ckpt, d: Path, *extra, env=None) -> tuple[ServerProcess, str]:
    proc = process.serve(ckpt, "--no-open", "--ssd-cache", d, *extra, env=env)
    return proc, proc.base


def test_sigterm_flushes_and_a_sigkill_after_a_reply_is_survived(tmp_path):
    ckpt = tiny_checkpoint("qwen3")
    d = tmp_path / "ssd"
    plain = Engine.load(str(ckpt), progress=False, prompt_cache_bytes=0)
    try:
        # 1. no write-behind, no idle demotion: the entry is in RAM only until SIGTERM
        proc, base = serve(ckpt, d, "--ssd-demote-idle", "0", env={"MLXBUN_SSD_WRITEBEHIND": "0"})
        with proc:
            msgs1 = [SYSTEM, USER]
            r1 = turn(base, msgs1)
            ssd = httpx.get(base + "/stats", timeout=30).json()["ssd_cache"]
            assert ssd["entries"] == 0 and ssd["pending_snapshots"] == 1
            proc.proc.send_signal(signal.SIGTERM)
            assert proc.proc.wait(120) == 0
        first_log = proc.output
        assert ids(r1) == cold(plain, msgs1)

        # 2. a restart restores it; the server dies (SIGKILL) right after its reply
        msgs2 = next_turn(msgs1, r1, "And the mountains?")
        proc, base = serve(ckpt, d)
        with proc:
            r2 = turn(base, msgs2)
            time.sleep(random.uniform(0, 0.05))
            proc.proc.kill()
            proc.proc.wait(30)
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # only the flush wrote it
        assert ids(r2) == cold(plain, msgs2)
        assert "shutdown: ssd cache flushed" in first_log

        # 3. whatever the kill left is either a whole file or reaped; the next turn is right
        msgs3 = next_turn(msgs2, r2, "And the rivers?")
        proc, base = serve(ckpt, d)
        with proc:
            r3 = turn(base, msgs3)
            st = httpx.get(base + "/stats", timeout=30).json()
        assert ids(r3) == cold(plain, msgs3)
        assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert st["ssd_cache"]["corrupt_removed"] == 0
        assert not [p for p in d.rglob(TMP_PREFIX + "*")]
    finally:
        close(plain)


# A writer process that stores 16 MB entries back to back until it is killed; the parent
# regenerates each entry's content from its first token to check what was restored. It
# imports, says "ready" and waits for "go": the next round's writer imports (mlx-lm: seconds)
# while this round runs.
WRITER = r"""
import sys
if __name__ == "__main__":  # the writer process (the test also execs this for its helpers)
    sys.modules["torch"] = None  # as serve keeps it out (torchless): seconds less
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from mlxbun_core.kvstore.config import SsdConfig
from mlxbun_core.kvstore.store import SsdStore

def entry(i):
    c = KVCache()
    k = mx.random.normal((1, 8, 4096, 128), key=mx.random.key(i)).astype(mx.bfloat16)
    c.update_and_fetch(k, -k)
    return [c]

def tokens(i):
    return [100000 + i] + list(range(63))

def pause_after(limit):
    # write `limit` bytes of files, then stop for good (the parent kills it there):
    # every file write goes through os.write, prints never do
    import os, time
    real, done = os.write, [0]

    def write(fd, data):
        if done[0] >= limit:
            print("paused", flush=True)
            time.sleep(600)
        n = real(fd, data)
        done[0] += n
        return n

    os.write = write

if __name__ == "__main__":
    d, i = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        pause_after(int(sys.argv[3]))
    print("ready", flush=True)  # imported (seconds): the store opens once told to go
    assert sys.stdin.readline().strip() == "go"
    store = SsdStore(SsdConfig(dir=d, demote_idle_s=0), "fp", namespace_parts=lambda ns: [ns])
    while True:
        job = store.prepare(store.key("ns"), tokens(i), entry(i), "assistant")
        job.urgent = True
        print("writing", i, flush=True)
        store.submit(job)
        store.flush(120)
        print("wrote", i, flush=True)
        i += 1
"""


def torn_entries(d: Path) -> list:
    """Files under their final names that do not read whole (what a writer that is not
    atomic leaves when killed mid-write)."""
    torn = []
    for p in d.rglob("*" + SUFFIX):
        if not p.name.startswith(TMP_PREFIX):
            try:
                read_header(p)
            except CorruptEntry as exc:
                torn.append(f"{p.name}: {exc}")
    return torn


def test_a_writer_killed_halfway_through_an_entry_leaves_nothing_torn(tmp_path):
    """A SIGKILL landed for certain inside a write: the writer stops after 8 of the
    entry's 16 MB; nothing under a final name may be torn, then or after the kill."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    d = tmp_path / "ssd"
    child = subprocess.Popen([sys.executable, str(script), str(d), "0", str(8 << 20)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.stdin.write("go\n")
        child.stdin.flush()
        lines = [child.stdout.readline() for _ in range(2)]
        assert lines == ["writing 0\n", "paused\n"], lines
        assert list(d.rglob("*" + SUFFIX)), "the write had not begun"
        assert not torn_entries(d), "a half-written entry is visible under its final name"
    finally:
        child.kill()
        child.wait(30)
    assert not torn_entries(d)
    store = SsdStore(SsdConfig(dir=d, demote_idle_s=0), "fp", namespace_parts=lambda ns: [ns])
    try:
        assert store.index.corrupt_removed == 0 and len(store.index) == 0
        assert not list(d.rglob(TMP_PREFIX + "*"))  # the dead writer's temp file is reaped
    finally:
        store.close()


def test_sigkill_at_random_points_mid_write_never_serves_a_torn_entry(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    helpers: dict = {}
    # entry() and tokens(), as the child has them
    exec(compile(WRITER, str(script), "exec"), helpers)
    d = tmp_path / "ssd"
    rng = random.Random(7)
    mid_write = written = 0
    write_s = 0.2  # a write's duration, measured as the rounds go

    def writer(round_: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), str(d), str(1000 * round_)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    spare: subprocess.Popen | None = writer(0)
    try:
        for round_ in range(6):
            assert spare is not None
            child, spare = spare, (writer(round_ + 1) if round_ < 5 else None)
            assert child.stdout.readline().strip() == "ready"
            child.stdin.write("go\n")
            child.stdin.flush()
            goal, seen, started = rng.randint(1, 3), 0, time.monotonic()
            while seen < goal:  # into the first, second or third write...
                line = child.stdout.readline()
                assert line, "the writer died"
                if line.startswith("writing"):
                    seen, started = seen + 1, time.monotonic()
                elif line.startswith("wrote"):  # (timing the writes as they go)
                    written += 1
                    write_s = 0.5 * write_s + 0.5 * (time.monotonic() - started)
            time.sleep(rng.uniform(0, 1.5 * write_s))  # ...then a random point of it
            child.send_signal(signal.SIGKILL)
            out = child.communicate(timeout=30)[0]
            written += out.count("wrote")
            # a kill that hit a write: one was in flight (printed "writing", never "wrote")
            mid_write += 1 + out.count("writing") > out.count("wrote")
            assert not torn_entries(d), "a half-written entry under its final name"
            store = SsdStore(SsdConfig(dir=d, demote_idle_s=0), "fp",
                             namespace_parts=lambda ns: [ns])
            assert not list(d.rglob(TMP_PREFIX + "*"))  # the dead writer's temp file is reaped
            assert store.index.corrupt_removed == 0
            entries = list(store.index.entries())
            assert len(entries) >= written
            for e in [e for e in entries if int(e.tokens[0]) - 100000 >= 1000 * round_]:
                got = store.restore(e)  # every named file restores whole, with its own content
                assert got is not None, e.path
                i = int(e.tokens[0]) - 100000
                want = helpers["entry"](i)[0].keys[..., :4096, :]
                assert mx.array_equal(got[0][0].keys, want).item()
            store.close()
    finally:
        if spare is not None:
            spare.kill()
            spare.wait()
    assert mid_write >= 1, "no kill landed inside a write; the test proved nothing"
