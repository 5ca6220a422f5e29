"""The SSD tier restores an entry only when that beats recomputing it, from the first
request of a fresh process on: the restore rate is probed once per directory (or set),
the prefill rate calibrated at start and kept from real prompts; both ways, with
injected rates and across real restarts."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.prompt_cache import PrefixCache
from mlxbun_core.kvstore import rates
from mlxbun_core.kvstore.config import SsdConfig
from mlxbun_core.kvstore.store import SsdStore
from mlxbun_core.testing import process
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, run_all, token_ids
from mlxbun_core.testing.helpers import configure
from mlxbun_core.testing.process import ServerProcess

NS = ("m", "/p", "", "kv:native", "")


def store_at(d: Path) -> SsdStore:
    return SsdStore(SsdConfig(dir=d, demote_idle_s=0), "fp", namespace_parts=lambda ns: list(ns))


def one_entry(d: Path) -> tuple[SsdStore, list[int]]:
    """A store holding one 100-token entry on disk."""
    store = store_at(d)
    c = KVCache()
    c.update_and_fetch(mx.zeros((1, 2, 100, 8)), mx.zeros((1, 2, 100, 8)))
    tokens = list(range(100))
    PrefixCache(1 << 20, tier=store).store(NS, tokens, [c])
    assert store.flush(10)
    return store, tokens


def fresh(d: Path, prefill_tps: float) -> tuple[PrefixCache, SsdStore]:
    """What a restarted server has before its first request: a new store on the same
    directory, seeded, and the calibrated prefill rate."""
    store = store_at(d)
    store.seed_rates()
    cache = PrefixCache(1 << 20, tier=store)
    cache.prefill_rate = lambda: prefill_tps
    return cache, store


def test_the_first_lookup_of_a_fresh_process_already_weighs_restore_against_recompute(
        tmp_path, monkeypatch):
    configure(monkeypatch, cache={"ssd_read_gbs": None})
    _, tokens = one_entry(tmp_path)
    fast, store = fresh(tmp_path, 1e15)  # a device that prefills 100 tokens in no time
    assert store.restore_bps > 0 and store.restore_source == "measured now"
    assert fast.lookup(NS, tokens + [1]) == (None, 0)  # recomputed, before any restore ran
    assert fast.stats()["ssd_skipped"] == 1 and store.restores == 0
    slow, store = fresh(tmp_path, 1.0)  # a token a second: the restore wins
    assert store.restore_source.startswith("measured 2")  # kept from the probe: no new one
    assert slow.lookup(NS, tokens + [1])[1] == 100 and store.restores == 1


def test_the_probe_runs_once_per_directory_and_a_setting_skips_it(tmp_path, monkeypatch):
    configure(monkeypatch, cache={"ssd_read_gbs": None})
    store = store_at(tmp_path)
    store.seed_rates()
    kept = json.loads((tmp_path / rates.READ_FILE).read_text())
    assert list(kept.values())[0]["bps"] == store.restore_bps > 1e6
    assert not list(tmp_path.glob(".probe-*"))  # the scratch entry is gone

    def no_probe(store, nbytes=0):
        raise AssertionError("probed again")

    monkeypatch.setattr(rates, "probe", no_probe)
    again = store_at(tmp_path)
    again.seed_rates()
    assert again.restore_bps == store.restore_bps
    configure(monkeypatch, cache={"ssd_read_gbs": 0.25})
    other = store_at(tmp_path / "elsewhere")
    other.seed_rates()
    assert (other.restore_bps, other.restore_source) == (0.25e9, "env MLXBUN_SSD_READ_GBS")


def test_a_prefill_rate_measured_on_real_prompts_is_kept_for_the_next_start(tmp_path):
    store = store_at(tmp_path)
    store.prefill.note(None)  # nothing measured yet: nothing kept
    assert store_at(tmp_path).prefill.tps is None
    store.prefill.note(1000.0)
    store.prefill.note(1100.0)  # within the drift: not written again
    assert store_at(tmp_path).prefill.tps == 1000.0
    store.prefill.note(5000.0)
    assert store_at(tmp_path).prefill.tps == 5000.0


def test_the_kept_rate_replaces_the_calibration_until_real_chunks_come():
    from mlxbun_core.engine.lanes.pace import PrefillPacer

    pacer = PrefillPacer()
    pacer.record(512, 0.01)  # a calibration pass on an empty cache: 51k tok/s
    pacer.calibration_passes = pacer.chunks
    pacer.seed(9000.0)  # what real long prompts reached last time
    assert pacer.rate == 9000.0 and not pacer.measured
    pacer.record(2048, 0.4, asked=2048)  # a real chunk: 5.1k tok/s, smoothed in
    assert pacer.measured and pacer.rate == pytest.approx(0.5 * 5120 + 0.5 * 9000)


def serve(ckpt, d: Path, env: dict) -> tuple[ServerProcess, str]:
    proc = process.serve(ckpt, "--no-open", "--ssd-cache", d, env=env)
    return proc, proc.base


def answer(base: str, prompt: str) -> tuple[list[int], dict]:
    r = httpx.post(base + "/v1/completions", timeout=300, json={
        "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": True})
    assert r.status_code == 200, r.text
    stats = httpx.get(base + "/stats", timeout=30).json()
    return [e["id"] for e in r.json()["choices"][0]["logprobs"]["content"]], stats


def test_across_real_restarts_this_disk_restores_and_a_slow_one_recomputes(tmp_path):
    """On this CPU a restore beats recomputing by far (measured rates: the probe of the
    first start is kept, the second start restores); told the disk reads a kilobyte a
    second, the third start recomputes instead. Every answer is a cold one's."""
    ckpt = tiny_checkpoint("qwen3", seed=31)
    d = tmp_path / "ssd"
    prompt = "The tide comes in and the tide goes out. " * 60
    prompts = [prompt, prompt + "And again.", prompt + "Once more."]
    answers, stats = [], []
    for disk in ("", "", "0.000001"):
        proc, base = serve(ckpt, d, {"MLXBUN_SSD_READ_GBS": disk})
        with proc:
            got, st = answer(base, prompts[len(answers)])
            answers.append(got)
            stats.append(st)
            assert httpx.post(base + "/admin/cache/flush", timeout=60).json()["durable"]
    plain = Engine.load(str(ckpt), progress=False, prompt_cache_bytes=0)
    try:
        assert answers == [token_ids(r) for r in run_all(plain, [greedy(p, 4) for p in prompts])]
    finally:
        close(plain)
    sources = [st["ssd_cache"]["restore_rate_source"] for st in stats]
    assert sources[0] == "measured now" and sources[1].startswith("measured 2")
    assert sources[2] == "env MLXBUN_SSD_READ_GBS"
    hits = [(st["prompt_cache"]["ssd_hits"], st["prompt_cache"]["ssd_skipped"]) for st in stats]
    assert hits == [(0, 0), (1, 0), (0, 1)]
