"""Tiny random-weight checkpoints in Hugging Face layout, for fast CPU tests.

Configs keep the key schema of published checkpoints (nesting, rope_parameters,
layer_types, MoE fields) scaled down; weights come from mlx-lm's own model
class for the config and are stored under HF names/layouts, so every
``sanitize`` transform (expert stacking, norm shifts, conv transposes, MLA
kv_b_proj splitting, wrapper prefixes) is exercised on load.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import shutil
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .tokenizer import CHATML_TEMPLATE, build_tokenizer

_TF4, _TF5 = "4.57.1", "5.5.0"


def _llama() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0", "use_cache": True,
    }


def _minicpm5() -> dict:
    # MiniCPM5 ships as a standard LlamaForCausalLM (model_type "llama"), untied.
    cfg = _llama()
    cfg.update(num_attention_heads=4, num_key_value_heads=1, rope_scaling=None,
               rope_theta=1000000.0, tie_word_embeddings=False,
               transformers_version=_TF4)
    return cfg


def _qwen2() -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 128, "max_position_embeddings": 32768,
        "max_window_layers": 2, "model_type": "qwen2", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
        "use_sliding_window": False,
    }


def _qwen3() -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 40960, "max_window_layers": 2, "model_type": "qwen3",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    }


def _gemma3_text() -> dict:
    # sliding_window_pattern 2 (real: 6) so two layers cover sliding + global.
    return {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None,
        "cache_implementation": "hybrid", "final_logit_softcapping": None,
        "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 1,
        "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": 512, "sliding_window_pattern": 2, "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0", "use_cache": True,
    }


def _gemma4_text() -> dict:
    # Shaped like gemma-4-31B's text_config: k_eq_v global layers, no PLE/KV sharing.
    return {
        "architectures": ["Gemma4ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attention_k_eq_v": True, "dtype": "bfloat16",
        "enable_moe_block": False, "expert_intermediate_size": None,
        "final_logit_softcapping": 30.0, "global_head_dim": 32, "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 64,
        "hidden_size_per_layer_input": 0, "initializer_range": 0.02,
        "intermediate_size": 128, "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 262144, "model_type": "gemma4_text",
        "moe_intermediate_size": None, "num_attention_heads": 4, "num_experts": None,
        "num_global_key_value_heads": 1, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "num_kv_shared_layers": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 512, "tie_word_embeddings": True, "top_k_experts": None,
        "use_bidirectional_attention": "vision", "use_cache": True,
        "use_double_wide_mlp": False, "transformers_version": _TF5,
    }


def _gemma4() -> dict:
    text = _gemma4_text()
    del text["architectures"], text["transformers_version"]
    return {
        "architectures": ["Gemma4ForConditionalGeneration"], "audio_config": None,
        "dtype": "bfloat16", "initializer_range": 0.02, "model_type": "gemma4",
        "text_config": text, "tie_word_embeddings": True, "transformers_version": _TF5,
        "vision_config": {
            "attention_bias": False, "dtype": "bfloat16", "global_head_dim": 16,
            "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 32,
            "intermediate_size": 64, "max_position_embeddings": 4096,
            "model_type": "gemma4_vision", "num_attention_heads": 2,
            "num_hidden_layers": 1, "num_key_value_heads": 2, "patch_size": 16,
            "pooling_kernel_size": 3, "position_embedding_size": 1024,
            "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 100.0,
                                                       "rope_type": "default"},
            "standardize": True, "use_clipped_linears": False,
        },
        "vision_soft_tokens_per_image": 280,
    }


def _qwen3_5_text(moe: bool) -> dict:
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True,
        "dtype": "bfloat16", "full_attention_interval": 2, "head_dim": 32,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 128, "layer_types": ["linear_attention", "full_attention"],
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_value_head_dim": 16,
        "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144,
        "mlp_only_layers": [], "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False, "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1],
                            "partial_rotary_factor": 0.25, "rope_theta": 10000000,
                            "rope_type": "default"},
        "tie_word_embeddings": not moe, "use_cache": True,
    }
    if moe:
        del text["intermediate_size"]
        text.update(model_type="qwen3_5_moe_text", decoder_sparse_step=1,
                    moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                    norm_topk_prob=True, output_router_logits=False,
                    router_aux_loss_coef=0.001, shared_expert_intermediate_size=32)
    return text


def _qwen3_5(moe: bool = False) -> dict:
    text = _qwen3_5_text(moe)
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe
                          else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": text,
        "tie_word_embeddings": text["tie_word_embeddings"], "transformers_version": _TF5,
        "vision_config": {
            "deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 32, "in_channels": 3, "initializer_range": 0.02,
            "intermediate_size": 64, "model_type": "qwen3_5_moe_vision" if moe
            else "qwen3_5_vision", "num_heads": 2, "num_position_embeddings": 2304,
            "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }


def _glm_moe_dsa() -> dict:
    # GLM-5.x: MLA + DSA indexer + sigmoid-routed MoE; layer 0 dense, layer 1 MoE.
    return {
        "architectures": ["GlmMoeDsaForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "dtype": "bfloat16", "ep_size": 1,
        "first_k_dense_replace": 1, "head_dim": 8, "hidden_act": "silu", "hidden_size": 64,
        "index_head_dim": 16, "index_n_heads": 2, "index_topk": 2048,
        "indexer_rope_interleave": True, "initializer_range": 0.02,
        "intermediate_size": 128, "kv_lora_rank": 16, "max_position_embeddings": 202752,
        "model_type": "glm_moe_dsa", "moe_intermediate_size": 32, "moe_layer_freq": 1,
        "n_group": 1, "n_routed_experts": 4, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "num_key_value_heads": 4, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
        "q_lora_rank": 32, "qk_head_dim": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "rms_norm_eps": 1e-05, "rope_interleave": True,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 1, "topk_method": "noaux_tc", "transformers_version": _TF5,
        "use_cache": True, "v_head_dim": 16,
    }


_QWEN2 = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
_QWEN3 = _QWEN2 + ["<tool_response>", "</tool_response>", "<think>", "</think>"]
_GEMMA = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]

FAMILY_SPECIAL_TOKENS: dict[str, list[str]] = {
    "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
              "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
              "<|finetune_right_pad_id|>"],
    "qwen2": _QWEN2,
    "qwen3": _QWEN3,
    "qwen3_5": _QWEN3 + ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                         "<|video_pad|>"],
    "qwen3_5_moe": _QWEN3 + ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                             "<|video_pad|>"],
    "gemma3_text": _GEMMA + ["<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                             "<end_of_image>"],
    "gemma4_text": _GEMMA + ["<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>",
                             "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
                             "<|tool_response>", "<tool_response|>", '<|"|>'],
    "glm_moe_dsa": ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
                    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                    "<think>", "</think>", "<tool_call>", "</tool_call>",
                    "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
                    "<arg_value>", "</arg_value>"],
    "minicpm5": ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>",
                 "</think>", "<tool_response>", "</tool_response>"],
}
FAMILY_SPECIAL_TOKENS["gemma4"] = FAMILY_SPECIAL_TOKENS["gemma4_text"] + [
    "<|image>", "<image|>", "<|image|>"]

# family -> (bos, eos, extra stop tokens for generation_config, pad, unk)
_TOKENS: dict[str, tuple] = {
    "llama": ("<|begin_of_text|>", "<|eot_id|>", ["<|end_of_text|>", "<|eom_id|>"], None, None),
    "qwen2": (None, "<|im_end|>", ["<|endoftext|>"], "<|endoftext|>", None),
    "qwen3": (None, "<|im_end|>", ["<|endoftext|>"], "<|endoftext|>", None),
    "qwen3_5": (None, "<|im_end|>", ["<|endoftext|>"], "<|endoftext|>", None),
    "qwen3_5_moe": (None, "<|im_end|>", ["<|endoftext|>"], "<|endoftext|>", None),
    "gemma3_text": ("<bos>", "<end_of_turn>", ["<eos>"], "<pad>", "<unk>"),
    "gemma4_text": ("<bos>", "<turn|>", ["<eos>"], "<pad>", "<unk>"),
    "gemma4": ("<bos>", "<turn|>", ["<eos>"], "<pad>", "<unk>"),
    "glm_moe_dsa": (None, "<|endoftext|>", ["<|user|>", "<|observation|>"],
                    "<|endoftext|>", None),
    "minicpm5": ("<s>", "<|im_end|>", ["</s>"], None, "<unk>"),
}
FAMILY_DEFAULT_EOS: dict[str, str] = {k: v[1] for k, v in _TOKENS.items()}

_CONFIGS = {
    "llama": _llama, "minicpm5": _minicpm5, "qwen2": _qwen2, "qwen3": _qwen3,
    "gemma3_text": _gemma3_text, "gemma4_text": _gemma4_text, "gemma4": _gemma4,
    "qwen3_5": _qwen3_5, "qwen3_5_moe": lambda: _qwen3_5(moe=True),
    "glm_moe_dsa": _glm_moe_dsa,
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_CONFIGS)


def default_eos(model_type: str) -> str:
    """The family's end-of-turn token (what generation should stop on)."""
    return FAMILY_DEFAULT_EOS[model_type]


def family_config(model_type: str) -> dict:
    """A fresh copy of the family's scaled-down config (vocab/token ids unset)."""
    if model_type not in _CONFIGS:
        raise ValueError(f"unsupported model_type {model_type!r}; "
                         f"choose from {SUPPORTED_MODEL_TYPES}")
    return _CONFIGS[model_type]()


def _merge(base: dict, over: Mapping) -> dict:
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


# ---------------------------------------------------------------- weights

def _random_params(model, seed: int, dtype: mx.Dtype) -> dict[str, mx.array]:
    """Matrices ~ N(0, 1/fan_in) keyed by (seed, name): independent of init order."""
    keep_f32 = getattr(model, "cast_predicate", None)
    out = {}
    for name, p in sorted(tree_flatten(model.parameters())):
        if p.ndim >= 2:
            key = mx.random.key(zlib.crc32(f"{seed}:{name}".encode()))
            fan_in = p.shape[1] if "conv1d" in name else p.shape[-1]
            p = mx.random.normal(p.shape, key=key) * (fan_in**-0.5)
        if mx.issubdtype(p.dtype, mx.floating):
            p = p.astype(mx.float32 if keep_f32 and not keep_f32(name) else dtype)
        out[name] = p
    mx.eval(out)
    return out


def _to_hf(model_type: str, w: dict[str, mx.array], config: dict) -> dict[str, mx.array]:
    """Invert mlx-lm's sanitize: rename/reshape mlx parameters to HF checkpoint layout."""
    hf = dict(w)
    if model_type in ("qwen3_5", "qwen3_5_moe"):
        norms = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                 "model.norm.weight", ".q_norm.weight", ".k_norm.weight")
        out = {}
        for k, v in hf.items():
            if "conv1d.weight" in k:
                v = v.swapaxes(1, 2)  # mlx [C, K, 1] -> HF [C, 1, K]
            elif v.ndim == 1 and k.endswith(norms):
                v = v - 1.0  # HF stores zero-centred (1 + w) RMSNorm weights
            k = k.replace("language_model.model.", "model.language_model.")
            k = k.replace("language_model.lm_head.", "lm_head.")
            out[k] = v
        hf = out
        for k in [k for k in hf if k.endswith(".switch_mlp.gate_proj.weight")]:
            base = k.removesuffix(".switch_mlp.gate_proj.weight")
            up = hf.pop(f"{base}.switch_mlp.up_proj.weight")
            hf[f"{base}.experts.gate_up_proj"] = mx.concatenate([hf.pop(k), up], axis=-2)
            hf[f"{base}.experts.down_proj"] = hf.pop(f"{base}.switch_mlp.down_proj.weight")
    elif model_type in ("gemma4", "gemma4_text"):
        hf = {k.replace("language_model.model.", "model.language_model."): v
              for k, v in hf.items()}
        for k in [k for k in hf if k.endswith(".switch_glu.gate_proj.weight")]:
            base = k.removesuffix(".switch_glu.gate_proj.weight")
            up = hf.pop(f"{base}.switch_glu.up_proj.weight")
            hf[f"{base}.gate_up_proj"] = mx.concatenate([hf.pop(k), up], axis=-2)
            hf[f"{base}.down_proj"] = hf.pop(f"{base}.switch_glu.down_proj.weight")
    elif model_type == "glm_moe_dsa":
        for k in [k for k in hf if ".mlp.switch_mlp." in k]:
            v = hf.pop(k)
            pre, proj = k.split(".switch_mlp.")
            for e in range(v.shape[0]):
                hf[f"{pre}.experts.{e}.{proj}"] = v[e]
        for k in [k for k in hf if k.endswith(".embed_q.weight")]:
            pre = k.removesuffix(".embed_q.weight")
            wk, wv = hf.pop(k), hf.pop(f"{pre}.unembed_out.weight")
            kv_b = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1)  # [H, nope+v, r]
            hf[f"{pre}.kv_b_proj.weight"] = kv_b.reshape(-1, kv_b.shape[-1])
    elif model_type == "gemma3_text" and config.get("tie_word_embeddings", True):
        hf.pop("lm_head.weight", None)
    return {k: mx.contiguous(v) for k, v in hf.items()}


def _build_weights(model_type: str, config: dict, seed: int, dtype: mx.Dtype):
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(copy.deepcopy(config)))
    params = _random_params(model, seed, dtype)
    hf = _to_hf(model_type, params, config)
    # Round-trip guard: sanitize must map our HF layout back onto the model exactly.
    back = model.sanitize(dict(hf))
    model.load_weights(list(back.items()), strict=True)
    for k, v in back.items():
        ref = params[k].astype(mx.float32)
        if not mx.allclose(v.astype(mx.float32), ref, atol=1e-2).item():
            raise AssertionError(f"{model_type}: sanitize round-trip changed {k}")
    return hf


def _save_safetensors(path: Path, tensors: Mapping[str, mx.array]) -> None:
    """Deterministic safetensors writer (sorted keys, HF ``format: pt`` metadata)."""
    names = {mx.float32: "F32", mx.bfloat16: "BF16", mx.float16: "F16"}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, off = [], 0
    for name in sorted(tensors):
        a = tensors[name]
        raw = np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- writer

def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_checkpoint(
    path,
    model_type: str = "llama",
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    chat_template: str | None = None,
    special_tokens: Sequence[str] = (),
    eos_token: str | None = None,
    bos_token: str | None = None,
    config_overrides: Mapping | None = None,
    generation_config: Mapping | None = None,
    tokenizer_config_extra: Mapping | None = None,
    extra_files: Mapping[str, Any] | None = None,
    dtype: str = "bfloat16",
) -> Path:
    """Write a tiny random checkpoint of ``model_type`` into ``path``; return it.

    ``model_type`` is a family key (``SUPPORTED_MODEL_TYPES``); "minicpm5" writes
    model_type "llama", as MiniCPM5 checkpoints do. ``extra_files`` maps relative
    names to str/bytes/JSON-able objects.
    """
    cfg = family_config(model_type)
    fam_bos, fam_eos, stops, pad, unk = _TOKENS[model_type]
    bos = bos_token if bos_token is not None else fam_bos
    eos = eos_token if eos_token is not None else fam_eos
    specials = list(special_tokens) or list(FAMILY_SPECIAL_TOKENS[model_type])
    stops = [] if eos_token is not None else [s for s in stops if s in specials]
    specials += [t for t in (bos, eos, pad, unk) if t and t not in specials]

    tok_json = build_tokenizer(vocab_size, specials, bos_token=bos)
    tok = json.loads(tok_json)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    n_tok = len(tok["model"]["vocab"])
    eos_ids = [ids[eos]] + [ids[s] for s in stops if s != eos]
    eos_val = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    tok_ids = {"bos_token_id": ids.get(bos), "eos_token_id": eos_val,
               "pad_token_id": ids.get(pad)}

    text = cfg.get("text_config", cfg)
    for c in {id(cfg): cfg, id(text): text}.values():
        c["vocab_size"] = vocab_size
        c.update({k: v for k, v in tok_ids.items() if v is not None})
    if "vocab_size_per_layer_input" in text:
        text["vocab_size_per_layer_input"] = vocab_size
    if model_type == "gemma4":
        cfg.update(boi_token_id=ids.get("<|image>"), eoi_token_id=ids.get("<image|>"),
                   image_token_id=ids.get("<|image|>"))
    if model_type in ("qwen3_5", "qwen3_5_moe"):
        cfg.update(image_token_id=ids.get("<|image_pad|>"),
                   video_token_id=ids.get("<|video_pad|>"),
                   vision_start_token_id=ids.get("<|vision_start|>"),
                   vision_end_token_id=ids.get("<|vision_end|>"))
    _merge(cfg, config_overrides or {})
    text = cfg.get("text_config", cfg)
    if text["vocab_size"] < n_tok or cfg.get("vocab_size", n_tok) < n_tok:
        raise ValueError(f"config vocab_size smaller than tokenizer ({n_tok})")

    weights = _build_weights(model_type, cfg, seed, getattr(mx, dtype))

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _dump(path / "config.json", cfg)
    _save_safetensors(path / "model.safetensors", weights)
    (path / "tokenizer.json").write_text(tok_json, encoding="utf-8")
    tcfg = {
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                              "single_word", "special")}
            for t in tok["added_tokens"]},
        "bos_token": bos, "eos_token": eos, "pad_token": pad, "unk_token": unk,
        "chat_template": CHATML_TEMPLATE if chat_template is None else chat_template,
        "clean_up_tokenization_spaces": False, "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    _dump(path / "tokenizer_config.json", {**tcfg, **(tokenizer_config_extra or {})})
    gen = {k: v for k, v in tok_ids.items() if v is not None}
    _dump(path / "generation_config.json",
          {**gen, **(generation_config or {}), "transformers_version": _TF4})
    for name, content in (extra_files or {}).items():
        f = path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            f.write_bytes(content)
        elif isinstance(content, str):
            f.write_text(content, encoding="utf-8")
        else:
            _dump(f, content)
    return path


# ---------------------------------------------------------------- cache

_cache: dict[str, Path] = {}
_lock = threading.Lock()
_root: Path | None = None


def _cleanup() -> None:
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)


def tiny_checkpoint(model_type: str = "llama", **kw) -> Path:
    """Memoized :func:`write_checkpoint` into a per-process temp dir (removed at exit).

    Callers must treat the returned directory as read-only: it is shared.
    """
    global _root
    key = json.dumps([model_type, kw], sort_keys=True, default=repr)
    with _lock:
        if key in _cache:
            return _cache[key]
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="mlxbun-ckpt-"))
            atexit.register(_cleanup)
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        out = write_checkpoint(_root / f"{model_type}-{digest}", model_type, **kw)
        _cache[key] = out
        return out
