"""resolve_model: default / local dir / local gguf (cached) / fake HF cache / clear not-found
errors."""

import json
import os
import shutil

import pytest

from mlxbun_core.models.resolve import ModelNotFound, resolve_model
from test_gguf import write_tiny_gguf

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def offline_hub(tmp_path, monkeypatch):
    """Never touch the network; point every HF cache variable into tmp_path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path / "home"))
    return tmp_path / "hf" / "hub"


def _fake_repo(hub, repo_id, files):
    """Lay out models--owner--name/{refs/main,snapshots/<sha>/...} like huggingface_hub does."""
    root = hub / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / SHA
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(SHA)
    for name, src in files.items():
        if isinstance(src, str):
            (snap / name).write_text(src)
        else:
            shutil.copy(src, snap / name)
    return snap


def test_default_reuses_session_conversion(smollm2_path, caplog):
    home = smollm2_path.parent.parent
    before = (smollm2_path / "model.safetensors").stat().st_mtime_ns
    caplog.set_level("INFO", logger="mlxbun.models")
    r = resolve_model(None, cache_dir=home, progress=False)
    assert (r.path, r.model_id, r.source) == (smollm2_path, "SmolLM2-135M-Instruct", "default")
    assert (r.path / "model.safetensors").stat().st_mtime_ns == before
    assert any("cached conversion" in m for m in caplog.messages)


def test_local_dir(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    r = resolve_model(str(d))
    assert (r.path, r.source, r.model_id) == (d.resolve(), "local", "ckpt")


def test_converted_dir_is_named_after_its_gguf(tmp_path, smollm2_path):
    """Our conversion directories are ``<stem>-<hash>``; serving one by path keeps the name."""
    assert resolve_model(str(smollm2_path)).model_id == "SmolLM2-135M-Instruct"
    g = tmp_path / "tiny.gguf"
    write_tiny_gguf(g)
    converted = resolve_model(str(g), progress=False).path
    assert converted.name != "tiny" and resolve_model(str(converted)).model_id == "tiny"


def test_local_gguf_converted_once_into_mlxbun_home(tmp_path, caplog):
    g = tmp_path / "tiny.gguf"
    write_tiny_gguf(g)
    caplog.set_level("INFO", logger="mlxbun.models")
    r1 = resolve_model(str(g), progress=False)
    assert r1.source == "gguf" and r1.model_id == "tiny"
    assert r1.path.parent == tmp_path / "home" / "converted" and r1.path.name.startswith("tiny-")
    assert json.loads((r1.path / "config.json").read_text())["model_type"] == "llama"
    st = (r1.path / "model.safetensors").stat().st_mtime_ns
    r2 = resolve_model(str(g), progress=False)
    assert r2.path == r1.path and (r2.path / "model.safetensors").stat().st_mtime_ns == st
    assert [m.split(" ")[1] for m in caplog.messages] == ["converting", "using"]
    assert sorted(p.name for p in r1.path.parent.iterdir()) == [r1.path.name]  # no temp leftovers
    os.utime(g, ns=(st + 10**9, st + 10**9))  # touched, same bytes: the same conversion
    assert resolve_model(str(g), progress=False).path == r1.path
    write_tiny_gguf(g, seed=1)  # edited: a new conversion
    assert resolve_model(str(g), progress=False).path != r1.path


def test_hub_cache_with_config(offline_hub):
    snap = _fake_repo(offline_hub, "acme/tiny", {"config.json": "{}", "model.safetensors": "x"})
    r = resolve_model("acme/tiny")
    assert (r.path, r.source, r.model_id) == (snap, "hub", "acme/tiny")


def test_hub_cache_gguf_only_repo_is_converted(offline_hub, tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf")
    _fake_repo(offline_hub, "acme/tiny-GGUF",
               {"tiny-Q8_0.gguf": tmp_path / "m.gguf", "README.md": "hi"})
    r = resolve_model("acme/tiny-GGUF", progress=False)
    assert r.source == "gguf" and r.model_id == "acme/tiny-GGUF"
    assert r.path.parent == tmp_path / "home" / "converted"
    assert (r.path / "model.safetensors").is_file()


def test_missing_path_message(tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(ModelNotFound) as e:
        resolve_model(str(missing))
    assert str(missing) in str(e.value) and "Fix" in str(e.value)


def test_missing_repo_offline_message(offline_hub):
    with pytest.raises(ModelNotFound) as e:
        resolve_model("acme/absent")
    msg = str(e.value)
    assert "'acme/absent'" in msg and str(offline_hub) in msg and "HF_HUB_OFFLINE" in msg


def test_dir_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))


@pytest.mark.parametrize("name", ["a" * 5000, "x\x00y", "~no-such-user-here/m",
                                  "/" + "b" * 300 + "/c"])
def test_impossible_names_are_not_found(name):
    with pytest.raises(ModelNotFound, match="not found"):
        resolve_model(name, progress=False)
