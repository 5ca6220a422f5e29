"""The local library: HF-cache scan, model queries, selection precedence, `mlxbun ls`/`fit`."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import mlx.core as mx
import pytest

from mlxbun_core import selection
from mlxbun_core.library.scan import scan
from mlxbun_core.models.resolve import AmbiguousModel, ModelNotFound, resolve_model
from mlxbun_core.selection import chosen_model
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure
from mlxbun_core.testing.hub_cache import add_to_hub_cache, library_env, library_hub

IDS = ["acme/Tiny-Gemma4-it", "acme/Tiny-Llama-Chat", "other/Qwen3-Tiny"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lib")
    env = library_env(root)
    hub = root / "hf" / "hub"
    snaps = library_hub(hub)
    # an architecture nothing can load, a dataset, and an older revision of a model
    junk = tiny_checkpoint("llama", seed=14)
    odd = root / "odd"
    shutil.copytree(junk, odd)
    cfg = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_arch"}))
    add_to_hub_cache(hub, "junk/Unknown-Arch", odd)
    (hub / "datasets--acme--data" / "snapshots").mkdir(parents=True)
    add_to_hub_cache(hub, "acme/Tiny-Llama-Chat", junk, commit="f" * 40, ref="old")
    # a model mlxbun converted itself
    shutil.copytree(tiny_checkpoint("llama", seed=15),
                    root / "home" / "converted" / "Converted-Model-0123456789ab")
    return root, env, snaps


@pytest.fixture
def env(root, monkeypatch):
    for k, v in root[1].items():
        monkeypatch.setenv(k, v)
    configure(monkeypatch, models={"default_model": "embedded"})
    return root[0]


def test_scan_rows_sizes_and_tiers(env, root):
    rows = {e.id: e for e in scan()}
    assert sorted(rows) == sorted(IDS + ["Converted-Model", "junk/Unknown-Arch"])
    snaps = root[2]
    for repo, snap in snaps.items():
        e = rows[repo]
        assert e.path == snap  # refs/main, not the older "old" revision
        real = sum(v.nbytes for v in mx.load(str(snap / "model.safetensors")).values())
        assert e.weights.total_bytes == real
        assert e.size_bytes == sum(os.path.getsize(f) for f in snap.iterdir())
        assert e.context_length == json.loads((snap / "config.json").read_text())[
            "max_position_embeddings"] if repo != "acme/Tiny-Gemma4-it" else e.context_length
    assert [rows[i].tier for i in IDS] == ["targeted", "generic", "generic"]
    assert rows["acme/Tiny-Gemma4-it"].claim.plugin == "gemma4"
    assert rows["junk/Unknown-Arch"].claim is None and rows["junk/Unknown-Arch"].tier is None
    assert rows["Converted-Model"].source == "mlxbun" and rows["Converted-Model"].tier == "generic"
    row = rows["acme/Tiny-Gemma4-it"].row()
    assert (row["model_type"], row["quant_bits"], row["vision"], row["audio"]) == (
        "gemma4", None, False, False)


def test_query_by_substring_exact_and_ambiguous(env, root):
    r = resolve_model("gemma4", library=scan)
    assert (r.model_id, r.path) == ("acme/Tiny-Gemma4-it", root[2]["acme/Tiny-Gemma4-it"])
    assert resolve_model("ACME/tiny-llama-chat", library=scan).model_id == "acme/Tiny-Llama-Chat"
    with pytest.raises(AmbiguousModel) as e:
        resolve_model("TINY", library=scan)
    assert e.value.candidates == IDS
    with pytest.raises(ModelNotFound) as e:  # owner/name means that repo: no substring guess
        resolve_model("acme/Tiny", library=scan)
    assert not isinstance(e.value, AmbiguousModel)


def test_a_query_matches_only_the_library_its_caller_passes(env, root):
    with pytest.raises(ModelNotFound):  # resolution never scans on its own
        resolve_model("gemma4")
    only = [e for e in scan() if e.id == "acme/Tiny-Llama-Chat"]
    assert resolve_model("tiny", library=lambda: only).model_id == "acme/Tiny-Llama-Chat"
    assert selection.resolve("gemma4").model_id == "acme/Tiny-Gemma4-it"  # the CLI's: the scan


def test_hf_snapshot_path_keeps_its_repo_id(env, root):
    r = resolve_model(str(root[2]["other/Qwen3-Tiny"]))
    assert r.model_id == "other/Qwen3-Tiny"


def test_selection_precedence(env, monkeypatch):
    ns = argparse.Namespace
    assert chosen_model(ns(model="gemma4", positional="llama", query="qwen3")) == "gemma4"
    assert chosen_model(ns(model=None, positional="llama", query="qwen3")) == "llama"
    assert chosen_model(ns(model=None, positional=None, query="qwen3")) == "qwen3"
    configure(monkeypatch, models={"default_model": "auto"})
    picked = chosen_model(ns(model=None, positional=None, query=None))
    supported = [e for e in scan() if e.claim]
    largest = max(supported, key=lambda e: e.weights.total_bytes)
    assert picked == str(largest.path)


def cli(env_root, *args):
    env = {**os.environ, **library_env(env_root)}
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_ambiguous_query_lists_candidates_and_exits_2(root):
    r = cli(root[0], "fit", "tiny")
    assert r.returncode == 2
    assert all(f"  {i}\n" in r.stderr for i in IDS) and "ambiguous" in r.stderr


def test_cli_ls_table_and_json(root):
    r = cli(root[0], "ls")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["MODEL", "TYPE", "TIER"]
    by_id = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert by_id["acme/Tiny-Gemma4-it"][1:4] == ["gemma4", "targeted", "gemma4"]
    assert by_id["junk/Unknown-Arch"][2] == "unsupported"
    rows = [json.loads(ln) for ln in cli(root[0], "ls", "qwen", "--json").stdout.splitlines()]
    assert [r["repo_id"] for r in rows] == ["other/Qwen3-Tiny"]
    assert rows[0]["assessment"]["fits"] is True and rows[0]["support_tier"] == "generic"


def test_cli_fit_prints_each_rate_once_and_says_what_it_assumed(root):
    r = cli(root[0], "fit", "acme/Tiny-Llama-Chat", "--ctx", "4096")
    assert r.returncode == 0, r.stderr
    predicted = next(ln for ln in r.stdout.splitlines() if "predicted decode" in ln)
    assert predicted.count("tok/s") == 1, predicted  # was "X tok/s at 4096 tokens, X tok/s at 4096"
    assumes = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("assumes"))
    assert "GB/s" in assumes and "measured through MLX" in assumes and "float32" in assumes


def test_the_decode_bandwidth_is_measured_once_and_reused(root):
    """``ls`` varied 7-24 tok/s between runs: each run timed a fresh numpy copy."""
    runs = [[json.loads(ln) for ln in cli(root[0], "ls", "--json").stdout.splitlines()]
            for _ in range(2)]
    rates = [[row["assessment"]["predicted_decode_tps"] for row in rows if row["assessment"]]
             for rows in runs]
    assert rates[0] and rates[0] == rates[1]
    remembered = json.loads((root[0] / "home" / "machine.json").read_text())
    assert len(remembered) == 1 and next(iter(remembered.values()))["gbs"] > 0


def test_cli_ls_vision_and_max_size_filter_the_rows(tmp_path):
    hub = tmp_path / "hf" / "hub"
    library_hub(hub)
    add_to_hub_cache(hub, "acme/Tiny-VL", tiny_checkpoint("qwen3_vl", seed=4, vision=True))
    every = [json.loads(ln) for ln in cli(tmp_path, "ls", "--json").stdout.splitlines()]
    sizes = sorted(r["size_bytes"] for r in every)
    cut = sizes[len(sizes) // 2]
    small = [json.loads(ln) for ln in
             cli(tmp_path, "ls", "--json", "--max-size", f"{cut}B").stdout.splitlines()]
    assert {r["repo_id"] for r in small} == {r["repo_id"] for r in every if r["size_bytes"] <= cut}
    assert 0 < len(small) < len(every)
    seeing = cli(tmp_path, "ls", "--json", "--vision").stdout.splitlines()
    seeing = [json.loads(ln) for ln in seeing]
    assert [r["repo_id"] for r in seeing] == ["acme/Tiny-VL"]
    assert cli(tmp_path, "ls", "--max-size", "lots").returncode == 2
