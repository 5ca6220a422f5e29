"""Disk GC on a real HF cache layout built by the test (blobs, refs, snapshot links),
plus mlxbun's own conversions and job leftovers; and ``mlxbun gc`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxbun_core.hub import gc
from mlxbun_core.jobs.store import JobStore
from mlxbun_core.library import partial
from mlxbun_core.testing.hub_cache import add_to_hub_cache


def checkpoint(root: Path, name: str, weights: bytes) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "model.safetensors").write_bytes(weights)
    return d


@pytest.fixture
def caches(tmp_path):
    """Two revisions of one repo (the old one superseded), a second repo served, an
    orphan blob, a download that died, a conversion whose GGUF is gone, a failed job."""
    hub, home, src = tmp_path / "hub", tmp_path / "home", tmp_path / "src"
    old = add_to_hub_cache(hub, "acme/A", checkpoint(src, "a1", b"old" * 1000), commit="1" * 40)
    new = add_to_hub_cache(hub, "acme/A", checkpoint(src, "a2", b"new" * 1000), commit="2" * 40)
    served_old = add_to_hub_cache(hub, "acme/B", checkpoint(src, "b1", b"b1" * 500),
                                  commit="3" * 40)
    served_new = add_to_hub_cache(hub, "acme/B", checkpoint(src, "b2", b"b2" * 500),
                                  commit="4" * 40)
    blobs_a = hub / "models--acme--A" / "blobs"
    (blobs_a / ("f" * 64)).write_bytes(b"orphan" * 100)
    died = add_to_hub_cache(hub, "acme/C", checkpoint(src, "c1", b"c" * 700), commit="5" * 40)
    (hub / "models--acme--C" / "refs" / "main").unlink()
    (hub / "models--acme--C" / "blobs" / ("e" * 64 + ".incomplete")).write_bytes(b"half")
    partial.mark(hub / "models--acme--C", "5" * 40, "acme/C", home)
    marks = partial.pending_dir(home) / f"models--acme--C@{'5' * 40}.json"
    data = json.loads(marks.read_text())
    marks.write_text(json.dumps({**data, "pid": 2 ** 22 + 12345}))  # a process that is gone
    conv = home / "converted" / "gone-0123456789ab-float16"
    conv.mkdir(parents=True)
    (conv / "model.safetensors").write_bytes(b"w" * 300)
    (conv / "mlxbun_source.json").write_text(json.dumps({"gguf": str(tmp_path / "gone.gguf")}))
    store = JobStore(home / "jobs.sqlite")
    out = home / "models" / "failed-q4"
    out.mkdir(parents=True)
    (out / "partial.safetensors").write_bytes(b"p" * 50)
    job = store.create("quantize", {}, output_path=str(out))
    store.append(job, {"type": "started"})
    store.append(job, {"type": "failed", "error": "boom"})
    return {"hub": hub, "home": home, "old": old, "new": new, "served": served_old,
            "served_new": served_new, "died": died, "conv": conv, "job_out": out,
            "tmp": tmp_path}


def ids(plan: dict) -> set[str]:
    return {i["id"] for i in plan["items"]}


def test_plan_lists_each_kind_with_sizes_and_spares_the_served_model(caches):
    p = gc.plan([caches["served"]], cache=caches["hub"], home=caches["home"])
    got = ids(p)
    assert f"revision:acme/A@{'1' * 40}" in got  # superseded by refs/main
    assert f"revision:acme/A@{'2' * 40}" not in got
    assert f"blob:acme/A/{'f' * 64}" in got
    assert f"incomplete:acme/C@{'5' * 40}" in got
    assert f"blob:acme/C/{'e' * 64}.incomplete" in got
    assert "conversion:gone-0123456789ab-float16" in got
    assert any(i.startswith("job-output:quantize-") for i in got)
    # acme/B's old revision is what this server serves: never proposed
    assert not any(i.startswith("revision:acme/B") for i in got)
    sizes = {i["id"]: i["bytes"] for i in p["items"]}
    # the config blob is shared with the kept revision: only the weights are reclaimed
    assert sizes[f"revision:acme/A@{'1' * 40}"] == 3000
    assert sizes[f"blob:acme/A/{'f' * 64}"] == 600
    assert p["reclaim_bytes"] == sum(sizes.values())


def test_execute_deletes_exactly_the_plan_and_keeps_what_is_used(caches):
    served = [caches["served"]]
    p = gc.plan(served, cache=caches["hub"], home=caches["home"])
    outside = caches["tmp"] / "src"  # the checkpoints the cache was built from
    out = gc.execute(served, plan_id=p["plan_id"], cache=caches["hub"], home=caches["home"])
    assert set(out["deleted"]) == ids(p)
    assert not caches["old"].exists() and caches["new"].is_dir()
    assert (caches["new"] / "model.safetensors").read_bytes() == b"new" * 1000  # links intact
    assert (caches["served"] / "model.safetensors").read_bytes() == b"b1" * 500
    assert not caches["conv"].exists() and not caches["job_out"].exists()
    assert not caches["died"].exists()
    assert outside.is_dir() and len(list(outside.rglob("*.safetensors"))) == 5
    assert out["reclaimed_bytes"] == p["reclaim_bytes"]
    again = gc.plan(served, cache=caches["hub"], home=caches["home"])
    assert again["items"] == []


def test_a_stale_plan_is_refused_and_items_can_be_chosen(caches):
    p = gc.plan([], cache=caches["hub"], home=caches["home"])
    assert f"revision:acme/B@{'3' * 40}" in ids(p)  # not served here: superseded like any
    (caches["hub"] / "models--acme--A" / "blobs" / ("d" * 64)).write_bytes(b"new orphan")
    with pytest.raises(gc.PlanChanged):
        gc.execute([], plan_id=p["plan_id"], cache=caches["hub"], home=caches["home"])
    assert caches["old"].exists()  # nothing was deleted
    fresh = gc.plan([], cache=caches["hub"], home=caches["home"])
    one = f"blob:acme/A/{'d' * 64}"
    out = gc.execute([], plan_id=fresh["plan_id"], only=[one], cache=caches["hub"],
                     home=caches["home"])
    assert out["deleted"] == [one] and caches["old"].exists()


def test_a_running_download_is_never_collected(caches):
    repo_dir = caches["hub"] / "models--acme--C"
    partial.mark(repo_dir, "5" * 40, "acme/C", caches["home"])  # this (live) process
    p = gc.plan([], cache=caches["hub"], home=caches["home"])
    assert not any("acme/C" in i for i in ids(p))


def test_a_path_outside_the_caches_is_never_deleted(caches, tmp_path):
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    store = JobStore(caches["home"] / "jobs.sqlite")
    job = store.create("finetune", {}, output_path=str(victim))
    store.append(job, {"type": "failed", "error": "x"})
    p = gc.plan([], cache=caches["hub"], home=caches["home"])
    assert f"job-output:{job}" not in ids(p)
    gc.execute([], plan_id=p["plan_id"], cache=caches["hub"], home=caches["home"])
    assert (victim / "keep.txt").read_text() == "keep"


def test_cli_gc_prints_the_plan_then_deletes_with_yes(caches):
    env = {**os.environ, "HF_HUB_CACHE": str(caches["hub"]), "MLXBUN_HOME": str(caches["home"])}
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "gc"]
    dry = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert dry.returncode == 0, dry.stderr
    assert f"revision:acme/A@{'1' * 40}" in dry.stdout and "--yes" in dry.stdout
    assert caches["old"].exists()
    done = subprocess.run(cmd + ["--yes"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "reclaimed" in done.stdout and not caches["old"].exists()


def test_a_model_another_server_announced_is_spared(caches):
    from mlxbun_core.hub import serving

    record = serving.announce(caches["served"], caches["home"])  # as a running server does
    try:
        p = gc.plan([], cache=caches["hub"], home=caches["home"])
        assert f"revision:acme/B@{'3' * 40}" not in ids(p)
    finally:
        serving.withdraw(record)
    assert f"revision:acme/B@{'3' * 40}" in ids(gc.plan([], cache=caches["hub"],
                                                        home=caches["home"]))
