"""Tiny checkpoints must load in mlx-lm, be deterministic and tokenize family markup."""

import json

import mlx.core as mx
import pytest
from mlx_lm import load, stream_generate

from mlxbun_core.testing import (
    FAMILY_SPECIAL_TOKENS,
    SUPPORTED_MODEL_TYPES,
    default_eos,
    tiny_checkpoint,
    write_checkpoint,
)

_loaded: dict = {}


def _load(model_type):
    if model_type not in _loaded:
        _loaded[model_type] = load(str(tiny_checkpoint(model_type)))
    return _loaded[model_type]


def _header(path):
    raw = (path / "model.safetensors").read_bytes()
    return json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_loads_and_forwards(model_type):
    model, tok = _load(model_type)
    path = tiny_checkpoint(model_type)
    cfg = json.loads((path / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    assert text["vocab_size"] >= len(tok.get_vocab())
    logits = model(mx.array([tok.encode("Hello world, 123")]))
    assert logits.shape[0] == 1 and logits.shape[-1] == text["vocab_size"]
    assert mx.isfinite(logits).all().item()
    assert logits.astype(mx.float32).std().item() > 0.1  # not degenerate


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_tokens_and_template(model_type):
    _, tok = _load(model_type)
    for t in FAMILY_SPECIAL_TOKENS[model_type]:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    assert default_eos(model_type) in FAMILY_SPECIAL_TOKENS[model_type]
    eos_id = tok.convert_tokens_to_ids(default_eos(model_type))
    assert eos_id in tok.eos_token_ids
    msgs = [{"role": "user", "content": "Call get_weather for Paris"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    assert len(ids) < len(text)  # BPE merged something


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_greedy_generate(model_type):
    model, tok = _load(model_type)
    def run():
        return [r.token for r in stream_generate(model, tok, "Hello", max_tokens=5)]
    first = run()
    assert 1 <= len(first) <= 5 and first == run()


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_deterministic_by_seed(model_type, tmp_path):
    a = write_checkpoint(tmp_path / "a", model_type, seed=1)
    b = write_checkpoint(tmp_path / "b", model_type, seed=1)
    c = write_checkpoint(tmp_path / "c", model_type, seed=2)
    for name in ("model.safetensors", "tokenizer.json", "config.json",
                 "tokenizer_config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_hf_layout_names():
    q = _header(tiny_checkpoint("qwen3_5_moe"))
    assert "model.language_model.layers.1.mlp.experts.gate_up_proj" in q
    conv = q["model.language_model.layers.0.linear_attn.conv1d.weight"]["shape"]
    assert conv[1] == 1 and conv[2] == 4  # HF [C, 1, K]
    g = _header(tiny_checkpoint("glm_moe_dsa"))
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in g
    assert "model.layers.0.self_attn.kv_b_proj.weight" in g
    assert any(k.startswith("model.language_model.") for k in _header(tiny_checkpoint("gemma4")))
    cfg = json.loads((tiny_checkpoint("minicpm5") / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is False


def test_options(tmp_path):
    p = write_checkpoint(
        tmp_path / "x", "qwen3", vocab_size=1500, special_tokens=["<|im_end|>", "<x>"],
        chat_template="{{ messages[0]['content'] }}", config_overrides={"num_hidden_layers": 3},
        generation_config={"temperature": 0.6, "top_p": 0.95},
        tokenizer_config_extra={"tool_parser_type": "json_tools"},
        extra_files={"notes/a.txt": "hi", "b.json": {"k": 1}},
    )
    cfg = json.loads((p / "config.json").read_text())
    gen = json.loads((p / "generation_config.json").read_text())
    tcfg = json.loads((p / "tokenizer_config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["vocab_size"] == 1500
    assert gen["temperature"] == 0.6 and gen["eos_token_id"] == cfg["eos_token_id"]
    assert tcfg["tool_parser_type"] == "json_tools" and tcfg["eos_token"] == "<|im_end|>"
    assert (p / "notes/a.txt").read_text() == "hi"
    assert json.loads((p / "b.json").read_text()) == {"k": 1}
    _, tok = load(str(p))
    assert len(tok.encode("<x>", add_special_tokens=False)) == 1
    assert tiny_checkpoint("qwen3", seed=5) == tiny_checkpoint("qwen3", seed=5)
