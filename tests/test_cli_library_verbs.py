"""``mlxbun get`` with the query form, ``mlxbun scan`` and ``mlxbun gc --force``, each a
real ``mlxbun`` subprocess against a local fake of the hub's HTTP API (the one boundary
tests may fake) and a real HF cache it downloads into."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.fake_hub import FakeHub, hub_environment, repo_from_dir


def mlxbun(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *args], env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("libverbs")
    ckpt = tiny_checkpoint("qwen3", seed=41)
    repos = {"acme/Qwen3-Tiny-8B-4bit": repo_from_dir(ckpt),
             "acme/Qwen3-Tiny-8B-8bit": repo_from_dir(ckpt),
             "other/Llama-Tiny": repo_from_dir(tiny_checkpoint("llama", seed=42))}
    with FakeHub(repos) as fake, hub_environment(root, fake) as cache:
        env = {**os.environ, "MLXBUN_HOME": str(root / "home")}
        for repo in repos:
            run = mlxbun("get", repo, env=env)
            assert run.returncode == 0, run.stderr
        yield {"hub": fake, "env": env, "cache": cache}


def snapshots(cache: Path, repo_id: str) -> list[str]:
    return sorted(p.name for p in (cache / ("models--" + repo_id.replace("/", "--"))
                                   / "snapshots").iterdir())


def test_get_words_refresh_the_one_downloaded_repo_they_match(hub):
    env, repo = hub["env"], hub["hub"].repos["acme/Qwen3-Tiny-8B-4bit"]
    old = snapshots(hub["cache"], "acme/Qwen3-Tiny-8B-4bit")
    repo.files["notes.md"] = b"upstream pushed a new commit"  # a new commit upstream
    run = mlxbun("get", "qwen3", "8b", "4BIT", env=env)
    assert run.returncode == 0, run.stderr
    assert "refreshing acme/Qwen3-Tiny-8B-4bit" in run.stderr
    assert "upstream moved on" in run.stdout and "`mlxbun gc` would reclaim" in run.stdout
    now = snapshots(hub["cache"], "acme/Qwen3-Tiny-8B-4bit")
    assert len(now) == 2 and set(old) < set(now)
    assert len(snapshots(hub["cache"], "acme/Qwen3-Tiny-8B-8bit")) == 1  # the other: untouched


def test_get_query_that_is_ambiguous_or_unknown_says_so_and_fetches_nothing(hub):
    env = hub["env"]
    asked = len(hub["hub"].requests)
    both = mlxbun("get", "qwen3-tiny", env=env)
    assert both.returncode == 2
    assert "acme/Qwen3-Tiny-8B-4bit" in both.stderr and "acme/Qwen3-Tiny-8B-8bit" in both.stderr
    none = mlxbun("get", "mistral", env=env)
    assert none.returncode == 2 and "mlxbun ls mistral" in none.stderr
    assert len(hub["hub"].requests) == asked  # the hub was never asked


def test_scan_lists_every_local_model_with_its_family(hub):
    run = mlxbun("scan", "--json", env=hub["env"])
    assert run.returncode == 0, run.stderr
    rows = {r["repo_id"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert set(rows) == {"acme/Qwen3-Tiny-8B-4bit", "acme/Qwen3-Tiny-8B-8bit", "other/Llama-Tiny"}
    llama = rows["other/Llama-Tiny"]
    assert llama["supported"] and llama["source"] == "hf-cache" and llama["family"]
    text = mlxbun("scan", env=hub["env"])
    assert "3 models indexed (3 servable)" in text.stdout


def test_gc_keeps_a_snapshot_with_files_the_new_one_lacks_unless_forced(hub):
    env, cache = hub["env"], hub["cache"]
    repo_id = "other/Llama-Tiny"
    repo = hub["hub"].repos[repo_id]
    del repo.files["generation_config.json"]  # upstream dropped a file in its new commit
    assert mlxbun("get", repo_id, env=env).returncode == 0
    old = snapshots(cache, repo_id)
    assert len(old) == 2
    plain = mlxbun("gc", "--yes", env=env)
    assert plain.returncode == 0, plain.stderr
    assert f"revision:{repo_id}@" in plain.stdout and "--force prunes it" in plain.stdout
    assert snapshots(cache, repo_id) == old  # kept: it holds a file the new one lacks
    forced = mlxbun("gc", "--yes", "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    new = snapshots(cache, repo_id)
    assert len(new) == 1 and "reclaimed" in forced.stdout
    assert repo_id in mlxbun("scan", "--json", env=env).stdout  # the kept one still resolves
