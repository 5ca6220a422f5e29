"""GGUF -> HF conversion: exact weight round trip on a tiny synthetic GGUF, real output on
SmolLM2."""

import json

import gguf
import numpy as np
import pytest

from mlxbun_core.models.gguf import UnsupportedGGUF, convert_gguf

H, HEADS, KV, FF, LAYERS = 32, 4, 2, 64, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_chars():
    """GPT-2's bytes_to_unicode table, so the tiny vocab covers every byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def llama_cpp_permute(w, n_head):
    """What llama.cpp's convert_hf_to_gguf.py does to Q/K rows (the thing we must undo)."""
    halves = w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
    return halves.swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, *, arch="llama", tok_model="gpt2", seed=0, tied=True):
    """A tiny random llama GGUF; returns the HF-layout weights it should convert back to."""
    rng = np.random.default_rng(seed)
    tokens = SPECIALS + _byte_chars() + ["Ġt", "he", "Ġthe"]
    merges = ["Ġ t", "h e", "Ġt he"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    V, hd = len(tokens), H // HEADS
    hf = {"model.embed_tokens.weight": rng.standard_normal((V, H)),
          "model.norm.weight": rng.standard_normal(H)}
    if not tied:
        hf["lm_head.weight"] = rng.standard_normal((V, H))
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        hf |= {p + "input_layernorm.weight": rng.standard_normal(H),
               p + "post_attention_layernorm.weight": rng.standard_normal(H),
               p + "self_attn.q_proj.weight": rng.standard_normal((HEADS * hd, H)),
               p + "self_attn.k_proj.weight": rng.standard_normal((KV * hd, H)),
               p + "self_attn.v_proj.weight": rng.standard_normal((KV * hd, H)),
               p + "self_attn.o_proj.weight": rng.standard_normal((H, H)),
               p + "mlp.gate_proj.weight": rng.standard_normal((FF, H)),
               p + "mlp.up_proj.weight": rng.standard_normal((FF, H)),
               p + "mlp.down_proj.weight": rng.standard_normal((H, FF))}
    hf = {k: v.astype(np.float32) for k, v in hf.items()}
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(12345.0)
    w.add_vocab_size(V)
    w.add_tokenizer_model(tok_model)
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{{ messages[0]['content'] }}")
    for k, v in hf.items():
        if k.startswith("model.layers."):
            i, rest = k[len("model.layers."):].split(".", 1)
            g = f"blk.{i}.{names[rest.rsplit('.', 1)[0]]}.weight"
        else:
            g = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}[k]
        if k.endswith("q_proj.weight"):
            v = llama_cpp_permute(v, HEADS)
        elif k.endswith("k_proj.weight"):
            v = llama_cpp_permute(v, KV)
        if k.endswith("mlp.up_proj.weight"):  # exercise a quantized path too
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(g, gguf.quants.quantize(v, q8), raw_dtype=q8)
        else:
            w.add_tensor(g, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def _load_st(path):
    import mlx.core as mx
    return {k: np.array(v) for k, v in mx.load(str(path / "model.safetensors")).items()}


def test_tiny_roundtrip_weights_config_tokenizer(tmp_path):
    hf = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", progress=False)
    got = _load_st(out)
    assert set(got) == set(hf)  # tied: no lm_head written
    for k, v in hf.items():
        # Q8_0 is lossy, F32 must be exact (incl. un-permuted Q/K)
        tol = 2e-2 if "up_proj" in k else 0
        np.testing.assert_allclose(got[k], v, atol=tol * np.abs(v).max(), err_msg=k)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["rope_theta"],
            cfg["max_position_embeddings"], cfg["vocab_size"]) == \
        (H, HEADS, KV, FF, LAYERS, 12345.0, 256, len(hf["model.embed_tokens.weight"]))
    assert cfg["tie_word_embeddings"] is True and cfg["model_type"] == "llama"
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert (tc["bos_token"], tc["eos_token"], tc["add_bos_token"]) == (
        "<|im_start|>", "<|im_end|>", False)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode("<|im_start|> the 42é<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2 and len(tok.id_to_token(ids[1])) == 4  # "Ġthe" merged
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|> the 42é<|im_end|>"
    import mlx_lm  # the whole point: mlx-lm loads it and runs a forward pass
    model, _ = mlx_lm.load(str(out))
    import mlx.core as mx
    assert model(mx.array([[1, 5, 6]])).shape == (1, 3, cfg["vocab_size"])


def test_untied_lm_head(tmp_path):
    write_tiny_gguf(tmp_path / "t.gguf", tied=False)
    out = convert_gguf(tmp_path / "t.gguf", tmp_path / "o", progress=False)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    assert "lm_head.weight" in _load_st(out)


def test_unsupported_arch_and_atomic_failure(tmp_path):
    write_tiny_gguf(tmp_path / "a.gguf", arch="mamba")
    with pytest.raises(UnsupportedGGUF, match="'mamba'.*supported: .*llama"):
        convert_gguf(tmp_path / "a.gguf", tmp_path / "out", progress=False)
    # failure mid-conversion (SPM tokenizer) must keep an older checkpoint intact and leave no
    # temp dirs
    write_tiny_gguf(tmp_path / "b.gguf", tok_model="llama")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(UnsupportedGGUF, match="tokenizer"):
        convert_gguf(tmp_path / "b.gguf", tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "out"]
    assert (tmp_path / "out" / "config.json").read_text() == "{}"


def test_an_architecture_that_is_no_string_is_unsupported(tmp_path):
    # a list once reached a dict lookup: TypeError (unhashable) instead of a clear refusal
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "llama")
    w.kv_data[0].pop("general.architecture")  # the writer always adds it as a string
    w.add_array("general.architecture", ["llama"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedGGUF, match=r"\['llama'\] is not supported"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "out", progress=False)


@pytest.fixture(scope="module")
def smol_md():
    """SmolLM2 GGUF metadata, parsed once (the reader takes seconds on the 49k-token vocab)."""
    from mlxbun_core.models.resolve import _default_gguf
    r = gguf.GGUFReader(str(_default_gguf()))
    return {k: f.contents() for k, f in r.fields.items()
            if k.startswith(("llama.", "tokenizer.ggml.tokens"))}


def test_smollm2_config_matches_gguf(smollm2_path, smol_md):
    md = smol_md
    cfg = json.loads((smollm2_path / "config.json").read_text())
    assert cfg["hidden_size"] == md["llama.embedding_length"] == 576
    assert cfg["num_hidden_layers"] == md["llama.block_count"]
    assert cfg["num_attention_heads"] == md["llama.attention.head_count"]
    assert cfg["num_key_value_heads"] == md["llama.attention.head_count_kv"]
    assert cfg["intermediate_size"] == md["llama.feed_forward_length"]
    assert cfg["rope_theta"] == md["llama.rope.freq_base"]
    assert cfg["max_position_embeddings"] == md["llama.context_length"]
    assert cfg["vocab_size"] == md["llama.vocab_size"] == 49152
    assert cfg["tie_word_embeddings"] is True  # the file has no output.weight


def test_smollm2_tokenizer_roundtrip(smollm2_path, smol_md):
    from tokenizers import Tokenizer
    tokens = smol_md["tokenizer.ggml.tokens"]
    tok = Tokenizer.from_file(str(smollm2_path / "tokenizer.json"))
    text = "<|im_start|>user\nPrice: 12345 € — naïve 日本語 🙂<|im_end|>\n"
    enc = tok.encode(text)
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    assert enc.ids[0] == tokens.index("<|im_start|>") == 1
    assert tokens.index("<|im_end|>") in enc.ids
    digits = [tok.id_to_token(i) for i in tok.encode("12345").ids]
    assert digits == list("12345")  # smollm pre-tokenizer splits every digit


def test_smollm2_answers_paris(smollm2_path):
    import mlx_lm
    model, tok = mlx_lm.load(str(smollm2_path))
    question = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    text = mlx_lm.generate(model, tok, prompt, max_tokens=20)
    assert "Paris" in text, text
