"""Vision (and audio) towers for tiny test checkpoints.

A published Gemma 4 or Qwen3.5 checkpoint carries its image tower (and for Gemma 4
e2b/e4b an audio tower) next to the language model, plus the processor configs
that say how pictures become patches. This module adds the same to a tiny random
checkpoint: the towers come from mlx-vlm's own model class for the config, stored
under Hugging Face names and layouts (so mlx-vlm's ``sanitize`` runs on load), and
the processor files keep the published key schema at a tiny size.
"""

from __future__ import annotations

import copy

import mlx.core as mx

from .weights import random_params

# extra special tokens a media checkpoint's tokenizer carries, per family
MEDIA_TOKENS = {
    "gemma4": {"image": ["<|image>", "<image|>", "<|image|>", "<|video|>"],
               "audio": ["<|audio>", "<audio|>", "<|audio|>"]},
    "qwen3_5": {"image": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]},
    "qwen3_vl": {"image": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]},
}
MEDIA_TOKENS["qwen3_5_moe"] = MEDIA_TOKENS["qwen3_5"]

GEMMA4_AUDIO = {  # the schema of gemma-4-e4b's audio_config, scaled down
    "attention_chunk_size": 12, "attention_context_left": 13, "attention_context_right": 0,
    "attention_invalid_logits_value": -1e9, "attention_logit_cap": 50.0, "conv_kernel_size": 5,
    "gradient_clipping": 1e10, "hidden_act": "silu", "hidden_size": 32,
    "model_type": "gemma4_audio",
    "num_attention_heads": 2, "num_hidden_layers": 1, "output_proj_dims": 48,
    "residual_weight": 0.5, "rms_norm_eps": 1e-6, "subsampling_conv_channels": [16, 8],
    "use_clipped_linears": True,
}


def vlm_model(config: dict):
    """mlx-vlm's model for ``config``, parameters randomly initialised."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    module, _ = get_model_and_args(config)
    cfg = copy.deepcopy(config)
    cfg.setdefault("audio_config", None)
    mc = module.ModelConfig.from_dict(cfg)
    mc = update_module_configs(mc, module, cfg, ["text", "vision", "audio"])
    return module.Model(mc)


def media_config(model_type: str, cfg: dict, ids: dict, audio: bool) -> None:
    """Token ids and tower configs a media checkpoint's ``config.json`` carries."""
    if model_type == "gemma4":
        cfg.update(boi_token_id=ids["<|image>"], eoi_token_id=ids["<image|>"],
                   image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"])
        if audio:
            cfg["audio_config"] = dict(GEMMA4_AUDIO)
            cfg.update(audio_token_id=ids["<|audio|>"], boa_token_id=ids["<|audio>"],
                       eoa_token_id=ids["<audio|>"])
    else:
        cfg.update(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                   vision_start_token_id=ids["<|vision_start|>"],
                   vision_end_token_id=ids["<|vision_end|>"])


def media_files(model_type: str, audio: bool) -> dict:
    """Processor configs (published key schema, tiny budgets) and tokenizer additions."""
    if model_type == "gemma4":
        proc = {"processor_class": "Gemma4Processor", "image_seq_length": 16,
                "audio_seq_length": 750, "audio_ms_per_token": 40,
                "image_processor": {"image_processor_type": "Gemma4ImageProcessor",
                                    "do_convert_rgb": True, "do_normalize": False,
                                    "do_rescale": True, "do_resize": True,
                                    "rescale_factor": 1 / 255, "patch_size": 16,
                                    "max_soft_tokens": 16, "pooling_kernel_size": 3}}
        extra = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                 "video_token": "<|video|>"}
        if audio:
            extra.update(audio_token="<|audio|>", boa_token="<|audio>", eoa_token="<audio|>")
        return {"processor_config.json": proc, "_tokenizer": {"extra_special_tokens": extra}}
    image = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
             "image_processor_type": "Qwen2VLImageProcessorFast", "merge_size": 2,
             "patch_size": 16, "temporal_patch_size": 2, "rescale_factor": 1 / 255,
             "size": {"longest_edge": 64 * 64 * 4, "shortest_edge": 32 * 32}}
    video = dict(image, video_processor_type="Qwen3VLVideoProcessor", fps=2, min_frames=4,
                 max_frames=768, size={"longest_edge": 64 * 64 * 8, "shortest_edge": 32 * 32})
    del video["image_processor_type"]
    return {"preprocessor_config.json": image, "video_preprocessor_config.json": video,
            "processor_config.json": {"processor_class": "Qwen3VLProcessor"}}


def _to_hf(model_type: str, name: str, v: mx.array) -> tuple[str, mx.array]:
    """An mlx-vlm tower parameter → its name and layout in a Hugging Face checkpoint."""
    if model_type == "gemma4":
        if "subsample_conv_projection" in name and name.endswith("conv.weight") and v.ndim == 4:
            v = v.transpose(0, 3, 1, 2)  # MLX [O, kH, kW, I] -> torch [O, I, kH, kW]
        elif name.endswith("depthwise_conv1d.weight") and v.ndim == 3:
            v = v.transpose(0, 2, 1)  # MLX [O, K, 1] -> torch [O, 1, K]
        return "model." + name, v
    if name.endswith("patch_embed.proj.weight") and v.ndim == 5:
        v = v.transpose(0, 4, 1, 2, 3)  # MLX [O, T, H, W, I] -> torch [O, I, T, H, W]
    return name.replace("vision_tower.", "model.visual.", 1), v


def tower_weights(model_type: str, config: dict, seed: int, dtype) -> dict:
    """Random tower weights (all of mlx-vlm's model but ``language_model``), HF-named."""
    mx.random.seed(seed)
    model = vlm_model(config)
    model.language_model = None  # built by mlx-lm's class elsewhere; not drawn twice here
    params = random_params(model, seed, dtype)
    towers = {k: v for k, v in params.items() if not k.startswith("language_model.")}
    hf = dict(_to_hf(model_type, k, v) for k, v in towers.items())
    # Round-trip guard: mlx-vlm's sanitize chain (model, then tower) must map the HF
    # layout back exactly.
    back = model.sanitize(dict(hf))
    if hasattr(model.vision_tower, "sanitize"):
        back = model.vision_tower.sanitize(back)
    for k, v in towers.items():
        if k not in back or not mx.array_equal(back[k], v).item():
            raise AssertionError(f"{model_type}: mlx-vlm sanitize round-trip changed {k}")
    return {k: mx.contiguous(v) for k, v in hf.items()}



# The chat template Qwen-VL checkpoints ship (ChatML; image and video parts become
# vision markers where they stand), reduced to what tests need.
QWEN_VL_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' or 'video' in item %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in item %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
