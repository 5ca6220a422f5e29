"""Per-family scaled-down configs and special tokens for tiny test checkpoints.

Each config keeps the key schema of a published checkpoint of that family
(nesting, rope_parameters, layer_types, MoE fields) at hidden 64 / 2 layers, or
the minimum the architecture needs to exercise every layer kind.
"""

from __future__ import annotations

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


def _qwen3_vl() -> dict:
    # Qwen3-VL (dense): a Qwen3 text stack with interleaved mRoPE and a ViT image tower.
    text = _qwen3()
    for k in ("architectures", "transformers_version", "torch_dtype", "use_sliding_window",
              "sliding_window", "max_window_layers", "rope_scaling"):
        text.pop(k, None)
    text.update(model_type="qwen3_vl_text", dtype="bfloat16", rope_theta=5000000,
                max_position_embeddings=262144,
                rope_scaling={"mrope_interleaved": True, "mrope_section": [2, 3, 3],
                              "rope_type": "default"})
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": text, "tie_word_embeddings": True, "transformers_version": "4.57.0",
        "vision_config": {
            "deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 32, "in_channels": 3, "initializer_range": 0.02,
            "intermediate_size": 64, "model_type": "qwen3_vl", "num_heads": 2,
            "num_position_embeddings": 2304, "out_hidden_size": 64, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2,
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
    "qwen3_vl": _QWEN3 + ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
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
    "qwen3_vl": (None, "<|im_end|>", ["<|endoftext|>"], "<|endoftext|>", None),
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
    "qwen3_5": _qwen3_5, "qwen3_5_moe": lambda: _qwen3_5(moe=True), "qwen3_vl": _qwen3_vl,
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


def _default_dtype(model_type: str) -> str:
    return "float32" if model_type in ("qwen3_5_moe", "glm_moe_dsa") else "bfloat16"
