"""Architectures refused on purpose (``models/unservable.py``): a DiffusionGemma checkpoint
(non-autoregressive) fails ``serve`` at start-up with exit 2, saying what it is and why it
is not served, before any weight is read."""

from __future__ import annotations

import json

import pytest

from mlxbun_core import loader
from mlxbun_core.cli import build_parser
from mlxbun_core.model import LoadOptions
from mlxbun_core.startup import StartFailed, load_engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint, write_checkpoint


@pytest.mark.parametrize("fields", [
    {"model_type": "diffusion_gemma", "architectures": ["DiffusionGemmaForCausalLM"]},
    {"model_type": "gemma3_text", "architectures": ["DiffusionGemmaForMaskedLM"]},
])
def test_diffusion_gemma_is_refused_at_start_up_with_the_reason(tmp_path, capsys, fields):
    path = write_checkpoint(tmp_path / "dg", "gemma3_text")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))
    (path / "model.safetensors").write_bytes(b"not read")  # refused before the weights
    with pytest.raises(loader.NoPluginClaimed, match="non-autoregressive"):
        loader.claim(path, LoadOptions(model_id="dg"))
    with pytest.raises(StartFailed) as failed:
        load_engine(build_parser().parse_args(["serve", str(path)]), None)
    assert failed.value.args == (2,)
    said = capsys.readouterr().err
    assert "DiffusionGemma is a non-autoregressive" in said and "not served" in said


def test_other_checkpoints_are_not_touched():
    path = tiny_checkpoint("gemma3_text")
    assert loader.claim(path, LoadOptions(model_id="g")).family == "generic"
