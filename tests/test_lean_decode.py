"""The lean decode step (``engine/batch/lean.py``) against mlx-lm's ``generate_step``.

Rows arriving apart decode through the lean forward, gathered and direct (the kernel's
contract in plain ops), on each family it mirrors: llama (tied and untied heads), qwen2
(biased projections), qwen3 (normed heads) and a 4-bit qwen3; every row's greedy tokens
must equal mlx-lm's, float32 on the CPU. Models it does not mirror keep their own
forward, the probe turns a wrong mirror away, and a lean step's graph is the smaller one.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm import load

from mlxbun_core.engine.batch import attention, direct, lean
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.graph import primitives
from test_engine_batch import N, batch_of, drive, prompts, reference

FAMILIES = {
    "llama": ("llama", {}),
    "llama-untied": ("llama", {"config_overrides": {"tie_word_embeddings": False}}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "qwen3-4bit": ("qwen3", {}),
}
_models: dict = {}


def model_of(name: str):
    if name not in _models:
        family, kw = FAMILIES[name]
        model = load(str(tiny_checkpoint(family, seed=3, dtype="float32", **kw)))[0]
        if name.endswith("4bit"):
            nn.quantize(model, group_size=32, bits=4)
        _models[name] = model
    return _models[name]


@pytest.mark.parametrize("way", ["gathered", "direct"])
@pytest.mark.parametrize("name", FAMILIES)
def test_lean_steps_equal_mlx_lm(name, way, monkeypatch):
    monkeypatch.setattr(attention, "MODE", "reference" if way == "direct" else "gather")
    model = model_of(name)
    b = batch_of(model)
    assert direct.probe(b) == (way == "direct")
    assert lean.probe(b) and b.lean is not None
    calls = []
    real = lean.LeanDecode.__call__
    monkeypatch.setattr(lean.LeanDecode, "__call__",
                        lambda self, *a: calls.append(1) or real(self, *a))
    ps = prompts()
    got = drive(b, ps)
    assert [got[i][:N] for i in range(len(ps))] == [reference(model, p) for p in ps]
    assert len(calls) >= N and b.pool.used == 0


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3_5"])
def test_models_it_does_not_mirror_keep_their_own_forward(family):
    model = load(str(tiny_checkpoint(family, seed=3, dtype="float32")))[0]
    assert lean.LeanDecode.of(model) is None
    b = batch_of(model)
    assert not lean.probe(b) and b.lean is None


def test_the_probe_turns_a_wrong_mirror_away(monkeypatch):
    """A mirror that drops the MLP (a planted bug) gives other logits: the batch keeps
    the model's own forward."""
    monkeypatch.setattr(lean.LeanDecode, "_mlp", lambda self, mlp, x: mx.zeros_like(x))
    b = batch_of(model_of("llama"))
    assert not lean.probe(b) and b.lean is None


def test_a_lean_step_builds_the_smaller_graph(monkeypatch):
    """No flatten around each projection, no per-step weight transposes: at least 20
    fewer primitives a layer than the model's own decode pass."""
    monkeypatch.setattr(attention, "MODE", "reference")
    model = model_of("qwen3")
    counts = []
    for on in (False, True):
        b = batch_of(model)
        direct.probe(b)
        lean.probe(b)
        if not on:
            b.lean = None
        b.add(0, prompts()[0], budget=4)
        while b.prefilling:
            b.prefill({u: 64 for u in b.prefilling})
        b.decode()  # (the first step; the second is the one counted)
        rows = [b.rows[u] for u in b.decoding]
        assert b.next_tokens is not None
        b.reserve(rows, [1] * len(rows))
        logits, _ = b.run_pass(b.next_tokens[:, None], rows, [1] * len(rows),
                               b.states.caches)
        counts.append(primitives(logits))
        b.close()
    heavy, light = counts
    layers = len(model.model.layers)
    assert "Flatten" in heavy and "Flatten" not in light and "Unflatten" not in light
    assert sum(heavy.values()) - sum(light.values()) >= 20 * layers


def test_gate_and_up_fused_decode_the_same_tokens(monkeypatch):
    """Each layer's gate and up weights moved into one buffer: one matmul fewer a layer,
    mlx-lm's tokens."""
    monkeypatch.setattr(attention, "MODE", "reference")
    monkeypatch.setattr(lean, "FUSE_MLP", True)
    model = load(str(tiny_checkpoint("qwen3", seed=3, dtype="float32")))[0]
    ps = prompts()
    want = [reference(model, p) for p in ps]
    b = batch_of(model)
    direct.probe(b)
    assert lean.probe(b) and b.lean is not None
    mlp = model.model.layers[0].mlp
    assert b.lean._gate_up[id(mlp)][0] is mlp.gate_proj.weight
    got = drive(b, ps)
    assert [got[i][:N] for i in range(len(ps))] == want


def test_fused_weights_are_not_held_twice():
    """The modules keep views of the fused buffer's halves: the model grows by less than
    one layer's gate weight (copies would add every layer's gate and up)."""
    model = load(str(tiny_checkpoint("qwen3", seed=3, dtype="float32")))[0]
    mx.eval(model.parameters())
    before = mx.get_active_memory()
    fused = lean.LeanDecode(model)  # (kept: it holds the fused buffers)
    assert fused.fuse_gate_up() == len(model.model.layers)
    grown = mx.get_active_memory() - before
    assert grown < model.model.layers[0].mlp.gate_proj.weight.nbytes


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_lone_stream_steps_lean_as_mlx_lm_decodes(family, monkeypatch):
    """A lone job's one-token steps run the lean forward over mlx-lm's own caches and
    give mlx-lm's greedy tokens (under --kv-quant its quantized caches take the model's
    own call: test_kvquant.py's lone stream equals mlx-lm's kv_bits loop)."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

    from mlxbun_core.testing.engine import close, engines, greedy, run_all, token_ids

    assert lean.plain_caches([KVCache(), KVCache()])
    assert not lean.plain_caches([KVCache(), QuantizedKVCache()])
    assert not lean.plain_caches([RotatingKVCache(max_size=8)])

    calls = []
    real = lean.LeanDecode.__call__
    monkeypatch.setattr(lean.LeanDecode, "__call__",
                        lambda self, *a: calls.append(len(a[1])) or real(self, *a))
    batched, serial = engines(tiny_checkpoint(family))
    body = greedy("The quick brown fox jumps over the lazy dog", 12)
    try:
        want = token_ids(run_all(serial, [body])[0])
        calls.clear()
        alone = run_all(batched, [body])[0]
        assert alone.finish.usage.lane == "batched" and token_ids(alone) == want
        assert len(calls) >= len(want) - 1  # (every step after the prompt's last token)
    finally:
        close(batched, serial)
