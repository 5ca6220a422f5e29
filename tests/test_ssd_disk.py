"""The SSD tier on a hostile disk: a full filesystem and a read-only directory keep the
server answering (RAM only, a warning in /stats, a failed flush), and two servers
sharing one directory neither corrupt each other nor miss each other's entries.

The full disk is a real 64 KiB tmpfs where this test may mount one (root with
CAP_SYS_ADMIN); elsewhere the server process runs under a 64 KiB RLIMIT_FSIZE, so its
writes fail the same way (EFBIG instead of ENOSPC). The read-only directory is a
read-only tmpfs for root, a ``chmod a-w`` tree for anyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.kvstore import durability
from mlxbun_core.kvstore.config import SsdConfig
from mlxbun_core.kvstore.fileformat import TMP_PREFIX
from mlxbun_core.kvstore.store import SsdStore
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close
from mlxbun_core.testing.process import serve
from mlxbun_core.testing.server import running_server
from mlxbun_core.testing.turns import SYSTEM, cold, engine_reply, greedy_chat, ids, next_turn, turn

N = 5  # tokens a turn answers with


def convo(topic: str) -> list:
    return [SYSTEM, {"role": "user", "content": f"Tell me about the {topic}. " * 14}]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3")


@pytest.fixture(scope="module")
def plain(ckpt):
    e = Engine.load(str(ckpt), progress=False, prompt_cache_bytes=0)
    yield e
    close(e)


def _mount(*args) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def tmpfs(where: Path, size: str):
    """A tmpfs of ``size`` at ``where`` (None when this process may not mount one)."""
    where.mkdir(parents=True, exist_ok=True)
    if not _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)):
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_keeps_the_server_answering(ckpt, plain, tmp_path):
    with tmpfs(tmp_path / "small", "64k") as small:
        d = (small or tmp_path) / "ssd"

        def cap_file_size():  # the fallback: every file this process writes stops at 64 KiB
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

        with serve(ckpt, "--no-open", "--ssd-cache", d, "--ssd-cache-max", "1",
                   preexec_fn=None if small else cap_file_size) as proc:
            base = proc.base
            msgs = convo("sea")
            r1 = turn(base, msgs, N)
            flushed = httpx.post(base + "/admin/cache/flush", timeout=60)
            assert flushed.status_code == 503 and flushed.json()["durable"] is False
            assert flushed.json()["missingSnapshots"] == 1
            ssd = httpx.get(base + "/stats", timeout=30).json()["ssd_cache"]
            assert ssd["degraded"] and ssd["failed_spills"] >= 1 and ssd["entries"] == 0
            r2 = turn(base, next_turn(msgs, r1), N)  # RAM still serves the prefix
            assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            r3 = turn(base, convo("sky"), N)
        assert ids(r1) == cold(plain, msgs, N) and ids(r3) == cold(plain, convo("sky"), N)
        assert ids(r2) == cold(plain, next_turn(msgs, r1), N)
        assert "serving from RAM only" in proc.output


@contextlib.contextmanager
def read_only_copy(src: Path, where: Path):
    """A read-only directory holding a copy of ``src``."""
    if os.geteuid() != 0:
        shutil.copytree(src, where)
        for p in [where, *where.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield where
        finally:
            for p in [where, *where.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)
        return
    with tmpfs(where, "64m") as mounted:
        if mounted is None:
            pytest.skip("root without CAP_SYS_ADMIN: no way to make a read-only directory here")
        shutil.copytree(src, mounted, dirs_exist_ok=True)
        assert _mount("-o", "remount,ro", str(mounted))
        yield mounted


def test_a_read_only_directory_still_restores_and_keeps_answering(ckpt, plain, tmp_path):
    msgs = convo("sea")
    filled = Engine.load(str(ckpt), progress=False,
                         ssd=SsdConfig(dir=tmp_path / "filled", demote_idle_s=0))
    try:
        reply = engine_reply(filled, greedy_chat(msgs, N)).content
        assert asyncio.run(durability.flush(filled, 60))["durable"]
    finally:
        close(filled)
    with read_only_copy(tmp_path / "filled", tmp_path / "ro") as ro:
        with pytest.raises(OSError):
            (ro / "probe").write_text("x")
        with running_server(ckpt, ssd=SsdConfig(dir=ro, demote_idle_s=0)) as srv:
            follow = next_turn(msgs, reply)
            r = turn(srv.base_url, follow, N)  # restored from the read-only directory
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            other = turn(srv.base_url, convo("sky"), N)
            flushed = httpx.post(srv.base_url + "/admin/cache/flush", timeout=60)
            stats = httpx.get(srv.base_url + "/stats", timeout=30).json()
        assert ids(r) == cold(plain, follow, N) and ids(other) == cold(plain, convo("sky"), N)
        assert flushed.status_code == 503
        assert stats["prompt_cache"]["ssd_hits"] == 1 and stats["ssd_cache"]["degraded"]


def ssd_hits(base: str) -> int:
    return httpx.get(base + "/stats", timeout=30).json()["prompt_cache"]["ssd_hits"]


def test_two_servers_share_one_directory(ckpt, plain, tmp_path):
    d = tmp_path / "shared"
    other = serve(ckpt, "--no-open", "--ssd-cache", d, ready=None)
    with other, running_server(ckpt, ssd=SsdConfig(dir=d)) as here:
        a, b = other.base, here.base_url
        other.wait_for_http(a + "/health", 240)
        topics = ["sea", "sky", "hills", "rain", "wind", "snow"]
        replies: dict = {}

        def run(base, topic):
            replies[topic] = turn(base, convo(topic), N)

        threads = [threading.Thread(target=run, args=(a if i % 2 else b, t))
                   for i, t in enumerate(topics)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for base in (a, b):  # both write at once, into the same namespace directories
            assert httpx.post(base + "/admin/cache/flush", timeout=60).json()["durable"]
        # a conversation the other server started is restored from its file
        follow = next_turn(convo("hills"), replies["hills"])
        served_by = a if topics.index("hills") % 2 else b
        restorer = b if served_by == a else a
        # a topic asked while the other server's entries were already on disk may have
        # restored the system prompt they share (timing): count the follow-up's own hit
        before = ssd_hits(restorer)
        r = turn(restorer, follow, N)
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert ssd_hits(restorer) == before + 1
        stats = [httpx.get(x + "/stats", timeout=30).json() for x in (a, b)]
        fingerprint = here.engine.prefix.tier.fingerprint
    assert ids(r) == cold(plain, follow, N)
    for t in topics:
        assert ids(replies[t]) == cold(plain, convo(t), N)
    assert all(s["ssd_cache"]["corrupt_removed"] == 0 for s in stats)
    check = SsdStore(SsdConfig(dir=d, demote_idle_s=0), fingerprint)
    assert len(check.index) >= len(topics) and not list(d.rglob(TMP_PREFIX + "*"))
    assert all(check.restore(e) is not None for e in check.index.entries())
    check.close()
