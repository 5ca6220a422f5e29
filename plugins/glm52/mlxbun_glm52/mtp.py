"""GLM-5.x's checkpoint-native multi-token-prediction layer as a speculative drafter
(``token_predictor`` hook; ``--mtp on|off``, ``--draft-kind mtp``, request
``draft_kind: "mtp"``).

GLM-5.x keeps DeepSeek-V3's MTP layout: ``num_nextn_predict_layers`` extra decoder layers
after the last, ``model.layers.{N}`` (N = ``num_hidden_layers``), each with ``enorm`` and
``hnorm`` (RMSNorms), ``eh_proj`` (2H -> H), a full decoder layer (MLA + DSA indexer +
routed MoE, as the main layers) and ``shared_head.norm``; ``shared_head.head`` and
``embed_tokens`` there are copies of the target's, which the head uses instead (no second
vocabulary matrix in memory). mlx-lm's ``deepseek_v32`` ``sanitize`` drops these layers;
they are read here, on first use, from the safetensors files that hold them. Given the
target's hidden state at ``p`` and the token at ``p + 1`` the head predicts ``p + 2``:

    x = eh_proj([enorm(embed(t[p+1])), hnorm(h[p])])
    x = layer(x)                    logits = lm_head(shared_head.norm(x))

``h`` is the target's final (normed) output, as vLLM and SGLang feed DeepSeek-style MTP;
further drafts chain the layer's output ``x``. Only the first MTP layer is used (GLM-5.x
ships one). The decoder layer is mlx-lm's own ``DeepseekV32DecoderLayer``, so its cache is
the main layers' ``CacheList`` (latent KV and indexer keys), paged on the batch lane.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from mlxbun_core.contract import LazyHeadPredictor, load_head_weights
from mlxbun_core.models.facts import activation_bytes

log = logging.getLogger("mlxbun.glm52")

# Z.ai's GLM-4.5/5 serving recipe (SGLang's EAGLE settings) drafts three tokens a round
DEFAULT_DRAFT_TOKENS = 3
REQUIRED = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
            "self_attn.", "mlp.")


def _head_class() -> Any:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.deepseek_v32 import DeepseekV32DecoderLayer

    class SharedHead(nn.Module):
        def __init__(self, hidden: int, eps: float):
            super().__init__()
            self.norm = nn.RMSNorm(hidden, eps=eps)

    class GlmMtpHead(nn.Module):
        """One ``model.layers.{N}``: the fusion of embedding and state, the decoder layer,
        the shared head's norm."""

        def __init__(self, args: Any):
            super().__init__()
            hidden, eps = args.hidden_size, args.rms_norm_eps
            self.enorm = nn.RMSNorm(hidden, eps=eps)
            self.hnorm = nn.RMSNorm(hidden, eps=eps)
            self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
            self.layer = DeepseekV32DecoderLayer(args, args.num_hidden_layers)
            self.shared_head = SharedHead(hidden, eps)

        def __call__(self, hidden: mx.array, embeds: mx.array,
                     cache: Any) -> tuple[mx.array, mx.array]:
            x = self.eh_proj(mx.concatenate([self.enorm(embeds), self.hnorm(hidden)], -1))
            mask = create_attention_mask(x, cache[0] if cache is not None else None,
                                         return_array=True)
            x = self.layer(x, mask, cache)
            return x, self.shared_head.norm(x)

    return GlmMtpHead


class GlmMtp(LazyHeadPredictor):
    """The target model plus its MTP layer, read on first use."""

    default_on = True  # the reference drafts with GLM-5.2's MTP unless --mtp off

    def __init__(self, model: Any, load_head: Callable[[], Any], name: str,
                 kv_bytes_per_token: int, weight_bytes: int):
        super().__init__(model.model, load_head, name=name,
                         num_draft_tokens=DEFAULT_DRAFT_TOKENS,
                         kv_bytes_per_token=kv_bytes_per_token, weight_bytes=weight_bytes)
        self.model = model

    def logits(self, normed: Any) -> Any:
        return self.model.lm_head(normed)

    def head_cache(self) -> list[Any]:
        from mlx_lm.models.cache import CacheList, KVCache

        return [CacheList(KVCache(), KVCache())]


def head_tensors(path: Path, layer: int) -> dict[Path, dict[str, Any]]:
    """``model.layers.{layer}.*`` header entries by the file holding them (headers only)."""
    prefix = f"model.layers.{layer}."
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({path / f for k, f in weight_map.items() if k.startswith(prefix)})
    else:
        files = sorted(path.glob("*.safetensors"))
    out: dict[Path, dict[str, Any]] = {}
    for f in files:
        with f.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            table = json.loads(fh.read(size))
        mine = {k: v for k, v in table.items() if k.startswith(prefix)}
        if mine:
            out[f] = mine
    return out


def load_predictor(model: Any) -> GlmMtp | None:
    """The MTP drafter of a loaded GLM-5.x model (None when the checkpoint carries no MTP
    layer, or an incomplete one: logged). Only file headers are read here."""
    config = model.config or {}
    main = int(config.get("num_hidden_layers", 0))
    if not int(config.get("num_nextn_predict_layers") or 0):
        return None
    found = head_tensors(Path(model.path), main)
    names = [k.split(".", 3)[3] for t in found.values() for k in t]
    missing = [r for r in REQUIRED if not any(n.startswith(r) for n in names)]
    if missing:
        if found:
            log.warning("the checkpoint's MTP layer lacks %s; serving without it", missing)
        return None
    e = activation_bytes(config)
    per_token = (int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)
                 + 2 * int(config.get("index_head_dim") or 0)) * e
    stored = sum(int(v["data_offsets"][1]) - int(v["data_offsets"][0])
                 for t in found.values() for k, v in t.items()
                 if not k.endswith(("shared_head.head.weight", "embed_tokens.weight")))
    return GlmMtp(model.model, lambda: _load_head(model, list(found), main),
                  f"{model.id} (mtp layer)", per_token, stored)


def _load_head(model: Any, files: list[Path], main: int) -> Any:
    """The head's weights through the target's own ``sanitize`` (experts stacked, MLA's
    ``kv_b_proj`` split, FP8 dequantized): the layer is renamed to the last main layer's
    index (a MoE layer), sanitized, and named back."""
    import mlx.core as mx

    prefix, stand_in = f"model.layers.{main}.", f"model.layers.{main - 1}."
    skip = ("shared_head.head.", "embed_tokens.")
    raw: dict[str, Any] = {}
    for f in files:
        loaded = cast("dict[str, mx.array]", mx.load(str(f)))  # a safetensors file: a dict
        for k, v in loaded.items():
            if k.startswith(prefix) and not k[len(prefix):].startswith(skip):
                raw[stand_in + k[len(prefix):]] = v
    weights = {k[len(stand_in):]: v for k, v in model.model.sanitize(raw).items()}
    weights = {("layer." + k if k.startswith(("self_attn.", "mlp.", "input_layernorm.",
                                              "post_attention_layernorm."))
                else k): v for k, v in weights.items()}
    return load_head_weights(_head_class()(model.model.args), weights, model.config or {})
