"""The SSD tier under the prefix cache, on real engines: a second turn warm from RAM, warm
from SSD after a restart (a new engine on the same directory) and cold give the same
greedy tokens on every family's tiny checkpoint, Gemma's wrapped sliding window and
Qwen3.5's recurrent state included; entries leaving RAM (eviction, idle demotion) come
back from disk; namespaces and models never share entries; the flush route and /stats
report it."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.prompt_cache import PrefixCache
from mlxbun_core.kvstore import durability
from mlxbun_core.kvstore.config import SsdConfig
from mlxbun_core.kvstore.store import SsdStore
from mlxbun_core.testing.adapters import write_lora_adapter
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, token_ids
from mlxbun_core.testing.server import running_server
from mlxbun_core.testing.turns import SYSTEM, engine_reply, greedy_chat


def history(words: int) -> list:
    return [SYSTEM, {"role": "user", "content": "Tell me about the sea and the sky. " * words}]


def body(engine, messages, n=8):
    """A greedy chat body that never stops early at EOS (more tokens to compare)."""
    eos = getattr(engine.model.tokenizer, "eos_token_ids", None) or []
    return {**greedy_chat(messages, n), "logit_bias": {str(t): -100 for t in eos}}


def mount(engine, id: str, adapter) -> None:
    engine.worker.run_sync(lambda: engine.adapters.mount(id, adapter))


def flush(engine) -> dict:
    return asyncio.run(durability.flush(engine, 60))


def load(path, d, batch: int = 8, **ssd) -> Engine:
    """An engine with the SSD tier under ``d`` (``ssd``: SsdConfig fields)."""
    return Engine.load(str(path), progress=False, batch=batch, ssd=SsdConfig(dir=d, **ssd))


CASES = {  # id: (model_type, history words, batch)
    "llama": ("llama", 12, 8), "qwen3": ("qwen3", 12, 8),
    "gemma3-window": ("gemma3_text", 12, 8),
    "gemma3-window-wrapped": ("gemma3_text", 90, 8),  # > 512 tokens: the ring has wrapped
    "gemma4": ("gemma4_text", 12, 8), "qwen3_5-recurrent": ("qwen3_5", 12, 8),
    "qwen3_5-serial": ("qwen3_5", 12, 1), "glm-mla": ("glm_moe_dsa", 12, 8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_warm_ram_warm_ssd_after_restart_and_cold_agree(case, tmp_path):
    model_type, words, batch = CASES[case]
    path = tiny_checkpoint(model_type)
    d = tmp_path / "ssd"
    first = load(path, d, batch=batch, demote_idle_s=0)
    plain = Engine.load(str(path), progress=False, batch=batch, prompt_cache_bytes=0)
    try:
        turn1 = engine_reply(first, body(first, history(words)))
        msgs = history(words) + [{"role": "assistant", "content": turn1.content},
                                 {"role": "user", "content": "And the mountains?"}]
        cold = engine_reply(plain, body(plain, msgs))
        warm_ram = engine_reply(first, body(first, msgs))
        assert flush(first)["durable"]
        close(first)
        restarted = load(path, d, batch=batch, demote_idle_s=0)
        warm_ssd = engine_reply(restarted, body(restarted, msgs))
        stats = restarted.prefix.stats()
        close(restarted)
    finally:
        close(first, plain)
    assert len(token_ids(cold)) == 8
    assert token_ids(warm_ram) == token_ids(cold)
    assert token_ids(warm_ssd) == token_ids(cold)
    assert warm_ram.finish.usage.cached_tokens > 0
    assert warm_ssd.finish.usage.cached_tokens >= warm_ram.finish.usage.cached_tokens > 0
    assert stats["ssd_hits"] == 1 and stats["hits"] == 0 and stats["misses"] == 0


def test_idle_entries_are_demoted_to_disk_and_restored(tmp_path):
    """Idleness is read on the tier's clock, moved here by hand (no wall-clock race): the
    background sweep never finds a 10-minute idleness in this test's real time, and the
    check that sweep runs is driven directly, its demotions on the worker thread."""
    path = tiny_checkpoint("qwen3")
    idle_s = 600.0
    e = load(path, tmp_path / "ssd", demote_idle_s=idle_s, write_behind=False)
    plain = Engine.load(str(path), progress=False, prompt_cache_bytes=0)
    posted = []
    try:
        turn1 = engine_reply(e, body(e, history(12)))
        e.worker.run_sync(lambda: None)  # the lane stores after the reply's Done
        ram, disk = e.prefix.stats()["entries"], e.prefix.tier.stats()
        assert (ram, disk["entries"], disk["demotions"]) == (1, 0, 0)  # in RAM, not on disk
        e.prefix._idle_sweep(posted.append)
        assert posted == []  # not idle yet: nothing to demote
        e.prefix.clock = lambda: time.monotonic() + idle_s  # ten minutes later
        e.prefix._idle_sweep(e.worker.run_sync)  # idle: written (queued, urgent) ...
        assert e.prefix.tier.flush(60)
        e.prefix._idle_sweep(e.worker.run_sync)  # ... and, once on disk, freed from RAM
        tier = e.prefix.tier.stats()
        assert e.prefix.stats()["entries"] == 0 and e.prefix.stats()["bytes"] == 0
        assert tier["demotions"] == 1 and tier["entries"] == 1 and tier["spills"] == 1
        msgs = history(12) + [{"role": "assistant", "content": turn1.content},
                              {"role": "user", "content": "And the mountains?"}]
        again = engine_reply(e, body(e, msgs))
        assert again.finish.usage.cached_tokens > 0 and e.prefix.stats()["ssd_hits"] == 1
        assert token_ids(again) == token_ids(engine_reply(plain, body(plain, msgs)))
    finally:
        close(e, plain)



def test_an_entry_evicted_from_ram_is_written_and_comes_back(tmp_path):
    path = tiny_checkpoint("llama")
    e = Engine.load(str(path), progress=False, prompt_cache_bytes=1024,  # nothing fits
                    ssd=SsdConfig(dir=tmp_path / "ssd", demote_idle_s=0, write_behind=False))
    try:
        turn1 = engine_reply(e, body(e, history(12)))
        e.worker.run_sync(lambda: None)  # the lane stores after the reply's Done
        assert e.prefix.tier.flush(30)
        assert e.prefix.stats()["entries"] == 0 and e.prefix.tier.stats()["spills"] == 1
        msgs = history(12) + [{"role": "assistant", "content": turn1.content},
                              {"role": "user", "content": "And the mountains?"}]
        assert engine_reply(e, body(e, msgs)).finish.usage.cached_tokens > 0
        assert e.prefix.stats()["ssd_hits"] == 1
    finally:
        close(e)


def test_namespaces_and_models_never_share_entries(tmp_path):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    store = SsdStore(SsdConfig(dir=tmp_path / "a", demote_idle_s=0), "fp",
                     namespace_parts=lambda ns: list(ns))
    ram = PrefixCache(1 << 20, tier=store)
    c = KVCache()
    c.update_and_fetch(mx.zeros((1, 2, 100, 8)), mx.zeros((1, 2, 100, 8)))
    tokens = list(range(100))
    native = ("m", "/p", "", "kv:native", "")
    ram.store(native, tokens, [c])
    assert store.flush(10) and store.stats()["entries"] == 1
    cold_ram = PrefixCache(1 << 20, tier=store)  # a restart: RAM empty, same directory
    for other in [("m", "/p", "", "kv:q8", ""), ("m", "/p", "lora#1", "kv:native", ""),
                  ("m", "/p", "", "kv:native", "media:abc"), ("m2", "/p", "", "kv:native", "")]:
        assert cold_ram.lookup(other, tokens + [1]) == (None, 0), other
    assert cold_ram.lookup(native, tokens + [1])[1] == 100
    # another model on the same directory: its own fingerprint, its own files
    path_a, path_b = tiny_checkpoint("qwen3"), tiny_checkpoint("qwen3", seed=5)
    a = load(path_a, tmp_path / "shared", demote_idle_s=0)
    try:
        engine_reply(a, body(a, history(12)))
        assert flush(a)["durable"]
    finally:
        close(a)
    b = load(path_b, tmp_path / "shared", demote_idle_s=0)
    plain_b = Engine.load(str(path_b), progress=False, prompt_cache_bytes=0)
    try:
        got = engine_reply(b, body(b, history(12)))
        assert got.finish.usage.cached_tokens == 0 and b.prefix.stats()["ssd_hits"] == 0
        assert token_ids(got) == token_ids(engine_reply(plain_b, body(plain_b, history(12))))
        assert a.prefix.tier.fingerprint != b.prefix.tier.fingerprint
    finally:
        close(b, plain_b)


def test_kv_schemes_and_adapters_sharing_a_directory_never_restore_each_others_kv(tmp_path):
    """Engines of one model on one ``--ssd-cache`` directory: what native KV wrote is never
    restored under ``--kv-quant 8`` nor for an adapter, nor one adapter's entry for another
    adapter mounted under the same id; each answers as a cold engine would. The native
    engine that comes back last does restore its entry (it was there to find)."""
    path = tiny_checkpoint("llama")
    d = tmp_path / "ssd"
    loras = [write_lora_adapter(path, tmp_path / f"lora{seed}", seed=seed) for seed in (1, 2)]
    cold = {"off": Engine.load(str(path), progress=False, prompt_cache_bytes=0),
            "8": Engine.load(str(path), progress=False, prompt_cache_bytes=0, kv_quant="8")}
    for i, lora in enumerate(loras):
        mount(cold["off"], f"a{i}", lora)
    first = load(path, d, demote_idle_s=0)
    try:
        turn1 = engine_reply(first, body(first, history(12)))
        assert flush(first)["durable"]
    finally:
        close(first)
    msgs = history(12) + [{"role": "assistant", "content": turn1.content},
                          {"role": "user", "content": "And the mountains?"}]
    try:
        for kv, lora, cold_id in (("8", None, None), ("off", 0, "a0"), ("off", 1, "a1")):
            e = Engine.load(str(path), progress=False, kv_quant=kv,
                            ssd=SsdConfig(dir=d, demote_idle_s=0))
            try:
                b = body(e, msgs)
                if lora is not None:  # the same id each time: only the files differ
                    mount(e, "a", loras[lora])
                got = engine_reply(e, {**b, **({} if lora is None else {"adapter": "a"})})
                assert flush(e)["durable"]  # its own entry, for the next engine to refuse
                hits = e.prefix.stats()["ssd_hits"]
            finally:
                close(e)
            asked = {**b, **({} if cold_id is None else {"adapter": cold_id})}
            want = engine_reply(cold[kv], asked)
            assert (hits, got.finish.usage.cached_tokens) == (0, 0), (kv, lora)
            assert token_ids(got) == token_ids(want), (kv, lora)
        again = load(path, d, demote_idle_s=0)
        try:
            got = engine_reply(again, body(again, msgs))
            assert again.prefix.stats()["ssd_hits"] == 1 and got.finish.usage.cached_tokens > 0
        finally:
            close(again)
    finally:
        close(*cold.values())


def test_flush_route_and_stats_fields(tmp_path):
    path = tiny_checkpoint("qwen3")
    ssd = SsdConfig(dir=tmp_path / "ssd", demote_idle_s=0, write_behind=False)
    with running_server(path, ssd=ssd) as srv:
        r = httpx.post(srv.v1 + "/chat/completions", timeout=60,
                       json={"messages": history(12), "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200
        stats = httpx.get(srv.base_url + "/stats").json()
        assert stats["ssd_cache"]["pending_snapshots"] == 1  # in RAM, not on disk yet
        assert stats["prompt_cache"]["misses"] == 1 and stats["prompt_cache"]["ssd_hits"] == 0
        f = httpx.post(srv.base_url + "/admin/cache/flush", timeout=60)
        assert f.status_code == 200, f.text
        report = f.json()
        assert report["durable"] and report["flushedSnapshots"] == 1 and report["entries"] == 1
        assert report["longest_durable_prefix_tokens"] > 100
        ssd_stats = httpx.get(srv.base_url + "/stats").json()["ssd_cache"]
        assert ssd_stats["entries"] == 1 and ssd_stats["spills"] == 1
        assert ssd_stats["pending_snapshots"] == 0 and ssd_stats["degraded"] is None
        again = httpx.post(srv.base_url + "/admin/cache/flush", timeout=60).json()
        assert again["durable"] and again["flushedSnapshots"] == 0  # nothing left to write
        for bad in (b"[1]", b"{", b'{"timeout_s": -1}', b'{"timeout_s": "5"}'):
            r = httpx.post(srv.base_url + "/admin/cache/flush", content=bad, timeout=30,
                           headers={"content-type": "application/json"})
            assert r.status_code == 400, bad
    with running_server(path) as srv:  # no tier: nothing to flush
        r = httpx.post(srv.base_url + "/admin/cache/flush", timeout=30)
        assert r.status_code == 200 and r.json()["enabled"] is False
        assert "ssd_cache" not in httpx.get(srv.base_url + "/stats").json()


def test_flags_need_the_ram_cache_and_warn_alone(tmp_path, capsys):
    from mlxbun_core.cli import main

    assert main(["serve", "--ssd-cache", str(tmp_path), "--prompt-cache", "0"]) == 2
    assert "--ssd-cache needs the RAM prompt cache" in capsys.readouterr().err
    from mlxbun_core.cli import build_parser
    from mlxbun_core.kvstore.flags import config_from_args

    args = build_parser().parse_args(["serve", "--ssd-cache-verify", "--ssd-demote-idle", "5"])
    assert config_from_args(args) == (None, None)
    assert "need --ssd-cache; ignored" in capsys.readouterr().err
    args = build_parser().parse_args(["serve", "--ssd-cache", str(tmp_path), "--ssd-cache-max",
                                      "2", "--ssd-demote-idle", "0"])
    config, problem = config_from_args(args)
    assert problem is None and config.max_bytes == 2 << 30 and config.demote_idle_s == 0


def test_a_restore_slower_than_recomputing_is_skipped(tmp_path):
    """On a device that prefills faster than its disk reads the KV back (an H200 with an
    8B model), the tier leaves the entry on disk and the prompt is recomputed; where
    prefill is slow (a CPU, a Mac) the same entry is restored."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    store = SsdStore(SsdConfig(dir=tmp_path / "a", demote_idle_s=0), "fp",
                     namespace_parts=lambda ns: list(ns))
    c = KVCache()
    c.update_and_fetch(mx.zeros((1, 2, 100, 8)), mx.zeros((1, 2, 100, 8)))
    tokens, ns = list(range(100)), ("m", "/p", "", "kv:native", "")
    PrefixCache(1 << 20, tier=store).store(ns, tokens, [c])
    assert store.flush(10)
    unknown = PrefixCache(1 << 20, tier=store)  # no restore measured yet: restore, and learn
    assert unknown.lookup(ns, tokens + [1])[1] == 100 and store.restore_bps > 0
    fast = PrefixCache(1 << 20, tier=store)
    fast.prefill_rate = lambda: 1e15  # recomputing 100 tokens takes no time at all
    assert fast.lookup(ns, tokens + [1]) == (None, 0)
    assert fast.stats()["ssd_skipped"] == 1 and fast.stats()["ssd_hits"] == 0
    slow = PrefixCache(1 << 20, tier=store)
    slow.prefill_rate = lambda: 1.0  # a token a second
    assert slow.lookup(ns, tokens + [1])[1] == 100 and slow.stats()["ssd_skipped"] == 0
