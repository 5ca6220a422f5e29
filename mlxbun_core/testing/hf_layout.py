"""Tiny checkpoints are written as the hub publishes them: mlx parameters renamed and
reshaped back to each architecture's Hugging Face layout (mlx-lm's ``sanitize`` undone),
so loading them exercises the same path a downloaded checkpoint takes."""

from __future__ import annotations

import mlx.core as mx


def to_hf(model_type: str, w: dict[str, mx.array], config: dict) -> dict[str, mx.array]:
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
    elif model_type == "qwen3_vl":
        hf = {k.replace("language_model.model.", "model.language_model.")
               .replace("language_model.lm_head.", "lm_head."): v for k, v in hf.items()}
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
