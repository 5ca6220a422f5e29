"""The SSD tier's store on real files and real MLX arrays: every cache kind the RAM tier
holds round-trips bit for bit and keeps decoding; a torn, truncated, bit-flipped or
foreign file is removed and never served; partial matches follow the trimmability
rule; the byte cap, the write queue's cap and supersession hold; a failing disk
degrades instead of raising."""

from __future__ import annotations

import os
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, QuantizedKVCache, RotatingKVCache

from mlxbun_core.kvstore.config import SsdConfig
from mlxbun_core.kvstore.fileformat import TMP_PREFIX, read_header, reap_orphans
from mlxbun_core.kvstore.store import SsdStore
from mlxbun_core.kvstore.writer import WriteJob, WriteQueue


def _kv(n, dtype=mx.bfloat16, dim=8):
    c = KVCache()
    c.update_and_fetch(mx.random.normal((1, 2, n, dim)).astype(dtype),
                       mx.random.normal((1, 2, n, dim)).astype(dtype))
    return c


def _rotating(n, window=16):
    c = RotatingKVCache(max_size=window)
    for _ in range(n):  # one at a time: the in-place ring path, wrapped past the window
        c.update_and_fetch(mx.random.normal((1, 2, 1, 8)), mx.random.normal((1, 2, 1, 8)))
    return c


def _recurrent():
    c = ArraysCache(2)
    c[0], c[1] = mx.random.normal((1, 3, 4)), mx.random.normal((1, 5)).astype(mx.bfloat16)
    return c


def _quantized(n):
    c = QuantizedKVCache(group_size=32, bits=4)
    c.update_and_fetch(mx.random.normal((1, 2, n, 64)), mx.random.normal((1, 2, n, 64)))
    return c


def store_at(d: Path, fingerprint="fp", **kw) -> SsdStore:
    return SsdStore(SsdConfig(dir=d, demote_idle_s=0, **kw), fingerprint,
                    namespace_parts=lambda ns: [ns])


def put(store: SsdStore, ns: str, tokens: list, cache: list) -> WriteJob:
    job = store.prepare(store.key(ns), tokens, cache, "assistant")
    job.urgent = True
    assert store.submit(job)
    assert store.flush(30)
    return job


def tensor_byte(path: Path, k: int = 0) -> int:
    """The file offset of a byte inside the ``k``-th tensor."""
    h = read_header(path)
    return h.data_start + h.tensors[k].offset + 3


def same_state(a, b) -> bool:
    """Equal up to the spare capacity a RAM buffer carries past ``offset``."""
    if isinstance(a, mx.array):
        if a.shape != b.shape:
            n = b.shape[-2]
            a = a[..., :n, :]
        return a.dtype == b.dtype and a.shape == b.shape and mx.array_equal(a, b).item()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture
def d(tmp_path):
    return tmp_path / "ssd"


def test_every_cache_kind_round_trips_and_keeps_decoding(d):
    s = store_at(d)
    cache = [_kv(10), _kv(5, mx.float16), _rotating(20), _rotating(5), _recurrent(),
             _quantized(10), CacheList(_kv(7), _kv(7, mx.float32))]
    tokens = list(range(100, 110))
    put(s, "ns", tokens, cache)
    found = s.find(s.key("ns"), tokens + [1])
    assert found is not None and found[1] == 10
    restored, cache_type = s.restore(found[0])
    assert cache_type == "assistant"
    assert [type(c) for c in restored] == [type(c) for c in cache]
    for a, b in zip(cache, restored):
        assert same_state(list(a.state), list(b.state)), type(a).__name__
    for a, b in zip(cache, restored):  # a restored cache takes the next token like the live one
        if isinstance(a, (KVCache, RotatingKVCache)):
            k = mx.ones((1, 2, 1, 8), a.keys.dtype)
            ka, _ = a.update_and_fetch(k, k)
            kb, _ = b.update_and_fetch(k, k)
            assert mx.array_equal(ka, kb).item()
    assert s.stats()["restores"] == 1 and s.stats()["spills"] == 1


def test_spare_capacity_is_not_written(d):
    s = store_at(d)
    c = _kv(10, mx.float32, dim=64)  # a 256-position buffer holding 10
    put(s, "ns", list(range(10)), [c])
    (entry,) = s.index.entries()
    assert entry.nbytes < 256 * 2 * 64 * 4  # 10 positions of K and V, not 256


def test_an_unwrapped_window_is_cut_to_its_positions(d):
    """A sliding window that has not wrapped yet is stored up to its offset (read from
    the cache's public ``state``); a wrapped one whole, ring order and all."""
    s = store_at(d)
    short, wrapped = _rotating(5, window=64), _rotating(70, window=64)
    put(s, "a", list(range(5)), [short])
    put(s, "b", list(range(200, 270)), [wrapped])
    held = {int(e.tokens[0]): [t.shape[2] for t in read_header(e.path).tensors]
            for e in s.index.entries()}
    assert held == {0: [5, 5], 200: [64, 64]}  # keys and values: positions held


@pytest.mark.parametrize("damage", ["flip_tensor_byte", "flip_header_byte", "truncate",
                                    "foreign", "empty", "other_fingerprint"])
def test_a_damaged_file_is_removed_and_never_served(d, damage):
    s = store_at(d)
    tokens = list(range(50, 90))
    put(s, "ns", tokens, [_kv(40)])
    (entry,) = s.index.entries()
    raw = bytearray(entry.path.read_bytes())
    if damage == "flip_tensor_byte":
        raw[tensor_byte(entry.path, 1)] ^= 0x10
    elif damage == "flip_header_byte":
        raw[40] ^= 0x01
    elif damage == "truncate":
        raw = raw[: len(raw) - 4096]
    elif damage == "foreign":
        raw = bytearray(os.urandom(len(raw)))
    elif damage == "empty":
        raw = bytearray()
    elif damage == "other_fingerprint":  # a whole valid file of another server, moved here
        other = store_at(d.parent / "elsewhere", fingerprint="other")
        put(other, "ns", tokens, [_kv(40)])
        raw = bytearray(next(other.index.entries()).path.read_bytes())
    entry.path.write_bytes(bytes(raw))
    if damage == "flip_tensor_byte":  # the header is intact: found, then refused on restore
        assert s.restore(entry) is None
    else:  # a fresh start scans headers and drops it at once
        s = store_at(d)
        assert len(s.index) == 0
    assert not entry.path.exists()
    assert s.find(s.key("ns"), tokens + [1]) is None
    assert s.index.corrupt_removed == 1


def test_verify_adds_a_strong_digest_that_is_checked(d):
    s = store_at(d, verify=True)
    put(s, "ns", list(range(20)), [_kv(20)])
    (entry,) = s.index.entries()
    assert s.restore(entry) is not None
    raw = bytearray(entry.path.read_bytes())
    raw[tensor_byte(entry.path)] ^= 0x01
    entry.path.write_bytes(bytes(raw))
    assert s.restore(entry) is None and not entry.path.exists()


def test_partial_matches_follow_trimmability(d):
    s = store_at(d)
    key = s.key("ns")
    long = list(range(1000, 1100))
    put(s, "ns", long, [_kv(100)])  # trimmable
    entry, usable = s.find(key, long[:60] + [7, 8])
    assert usable == 60  # the shared head, trimmed on restore
    assert s.find(key, long)[1] == 99  # the whole prompt: all but its last token
    other = list(range(2000, 2100))
    put(s, "ns", other, [_recurrent()])  # cannot rewind
    assert s.find(key, other[:60] + [7]) is None  # would need a trim: never restored
    assert s.find(key, other + [7])[1] == 100  # the whole entry is a prefix: taken
    assert s.find(key, other) is None  # it would hold the prompt's last token too
    assert s.find(s.key("other-ns"), long + [1]) is None  # namespaces never mix


def test_a_longer_trimmable_entry_supersedes_its_conversations_earlier_files(d):
    s = store_at(d)
    turn1 = list(range(300, 340))
    put(s, "ns", turn1, [_kv(40)])
    put(s, "ns", turn1 + list(range(5, 25)), [_kv(60)])  # extends it: one file left
    (entry,) = s.index.entries()
    assert entry.n == 60
    assert s.find(s.key("ns"), turn1 + [1])[1] == 40  # still served, by trimming
    # the next turn re-renders the reply's last tokens differently: still the same story
    turn3 = turn1 + list(range(5, 22)) + list(range(900, 960))
    put(s, "ns", turn3, [_kv(len(turn3))])
    (entry,) = s.index.entries()
    assert entry.n == len(turn3)
    # another conversation sharing only a head keeps its own file
    other = turn1[:10] + list(range(2000, 2050))
    put(s, "ns", other, [_kv(60)])
    assert len(s.index) == 2
    # a recurrent (non-rewindable) entry never replaces anything
    put(s, "ns", turn3 + [1, 2, 3], [_recurrent()])
    assert len(s.index) == 3


def test_the_byte_cap_removes_the_least_recently_used_files(d):
    s = store_at(d)
    paths = []
    for i in range(3):
        put(s, "ns", [i] * 10 + list(range(10)), [_kv(20, mx.float32, dim=64)])
        paths.append(max(s.index.entries(), key=lambda e: e.used).path)
        time.sleep(0.01)
    first = next(e for e in s.index.entries() if e.path == paths[0])
    s.index.touch(first, time.time() + 10)  # restored lately: now the most recent
    s.max_bytes = 3 * first.nbytes
    put(s, "ns", [9] * 10 + list(range(10)), [_kv(20, mx.float32, dim=64)])
    assert paths[0].exists() and not paths[1].exists() and paths[2].exists()
    assert len(s.index) == 3 and s.index.nbytes() <= s.max_bytes
    assert s.stats()["evicted"] == 1


def test_orphaned_temp_files_are_reaped_but_a_live_writers_is_not(d):
    import fcntl

    home = d / "fp" / "ns"
    home.mkdir(parents=True)
    dead = home / f"{TMP_PREFIX}1-dead.mlxkv"
    dead.write_bytes(b"x" * 100)
    live = home / f"{TMP_PREFIX}2-live.mlxkv"
    fd = os.open(live, os.O_CREAT | os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a writer holds while it writes
    try:
        assert reap_orphans(home) == 1
        assert not dead.exists() and live.exists()
    finally:
        os.close(fd)
    assert reap_orphans(home) == 1 and not live.exists()


def test_the_write_queue_caps_bytes_and_defers_background_writes_while_busy():
    busy = [True]
    written = []

    def write(job):
        written.append(job.tokens.tolist())
        return True

    q = WriteQueue(write, max_bytes=100, busy=lambda: busy[0])

    def job(tokens, nbytes, urgent=False, trimmable=False):
        return WriteJob("ns", np.array(tokens, np.int32), {}, [], [], nbytes, trimmable,
                        urgent=urgent)

    results = []
    first = job([1], 60)
    first.done.append(results.append)
    assert q.submit(first)
    dropped = job([2], 60)
    dropped.done.append(results.append)
    assert not q.submit(dropped)  # over the cap: dropped, its owner told at once
    assert results == [False] and q.dropped == 1
    time.sleep(0.5)
    assert written == []  # a background write waits while the engine is busy
    assert q.submit(job([3], 10, urgent=True))
    deadline = time.monotonic() + 5
    while [3] not in written and time.monotonic() < deadline:
        time.sleep(0.02)
    assert written == [[3]]  # an urgent one goes at once
    longer = job([1, 2, 3], 30, trimmable=True)
    assert q.submit(longer)  # supersedes the queued [1]
    busy[0] = False
    assert q.wait_idle(5)
    assert written == [[3], [1, 2, 3]] and q.superseded == 1
    assert results == [False, True]  # the superseded job is durable through its successor
    q.close()


def test_a_failing_disk_degrades_and_recovers(d, monkeypatch):
    from mlxbun_core.kvstore import store as store_mod

    s = store_at(d)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod, "write_entry", full)
    job = s.prepare(s.key("ns"), list(range(10)), [_kv(10)], "assistant")
    job.urgent = True
    s.submit(job)
    s.flush(10)
    st = s.stats()
    assert st["failed_spills"] == 1 and "ENOSPC" in st["degraded"] and st["entries"] == 0
    monkeypatch.undo()
    s._retry_at = 0  # the retry period has passed
    put(s, "ns", list(range(10)), [_kv(10)])
    assert s.stats()["degraded"] is None and s.stats()["entries"] == 1


def test_an_unusable_directory_leaves_a_working_store(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    s = store_at(blocker / "ssd")
    assert "cannot create" in s.stats()["degraded"]
    job = s.prepare(s.key("ns"), list(range(10)), [_kv(10)], "assistant")
    assert s.submit(job) and s.flush(5)
    assert s.find(s.key("ns"), list(range(11))) is None
