"""The checkpoint's multi-token-prediction head as a speculative drafter
(``token_predictor`` hook; ``--draft-kind mtp``, request ``draft_kind: "mtp"``).

Qwen3.5 / Qwen3-Next checkpoints ship ``mtp.*`` weights that mlx-lm's ``sanitize``
drops: ``pre_fc_norm_embedding`` and ``pre_fc_norm_hidden`` (RMSNorms), ``fc`` (2H -> H),
one full-attention decoder layer ``layers.0`` and a final ``norm``; the embeddings and
the output head are the target's. Given the target's hidden state at position ``p`` and
the token at ``p + 1`` the head predicts the token at ``p + 2``:

    x = fc([pre_fc_norm_embedding(embed(t[p+1])), pre_fc_norm_hidden(h[p])])
    out = norm(layer(x))            logits = lm_head(out)

Further drafts chain the head's own ``out`` in place of ``h``. Which ``h``: the last
layer's output before the target's final norm (the reference MLX drafter; the head's
first op is an RMSNorm, so that is the normed state divided by the final norm's weight,
recovered here without forking mlx-lm's model). ``MLXBUN_MTP_HIDDEN=post`` feeds the
normed state instead (what vLLM hands its Qwen3-Next MTP), for A/B on real weights.

The decoder layer is mlx-lm's own ``qwen3_5`` ``DecoderLayer`` built as a full-attention
layer; it keeps its own KV cache (one row per target position).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("mlxbun.qwen35")

PREFIX = "mtp."
DEFAULT_DRAFT_TOKENS = 2  # Qwen's recommended speculative depth for its MTP head


def mtp_weight_files(path: Path) -> list[Path]:
    """The safetensors files holding ``mtp.*`` tensors (none: the checkpoint has no head)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return sorted({path / f for k, f in weight_map.items() if k.startswith(PREFIX)})
    from safetensors import safe_open  # header only

    found = []
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            if any(k.startswith(PREFIX) for k in st.keys()):  # noqa: SIM118 (not a dict)
                found.append(f)
    return found


def _head_class() -> Any:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.qwen3_5 import DecoderLayer

    class MtpHead(nn.Module):
        """``mtp.*``: the fusion of embedding and hidden state, one decoder layer, a norm."""

        def __init__(self, args: Any):
            super().__init__()
            hidden, eps = args.hidden_size, args.rms_norm_eps
            self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=eps)
            self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=eps)
            self.fc = nn.Linear(2 * hidden, hidden, bias=False)
            # a layer index whose (i + 1) % interval == 0 is a full-attention layer
            self.layers = [DecoderLayer(args, args.full_attention_interval - 1)]
            self.norm = nn.RMSNorm(hidden, eps=eps)

        def __call__(self, hidden: mx.array, embeds: mx.array, cache: Any) -> mx.array:
            x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeds),
                                        self.pre_fc_norm_hidden(hidden)], axis=-1))
            x = self.layers[0](x, create_attention_mask(x, cache), cache)
            out: mx.array = self.norm(x)
            return out

    return MtpHead


def _sanitize(weights: dict[str, Any], raw_hf: bool) -> dict[str, Any]:
    """``mtp.X`` -> ``X``; HF's zero-centred RMSNorm weights get their ``+1`` (as mlx-lm's
    sanitize does for the target) when the checkpoint is a raw HF one; MoE experts, fused
    (``experts.gate_up_proj``) or one by one (``experts.N.gate_proj.weight``), become
    mlx-lm's stacked ``switch_mlp``."""
    import mlx.core as mx

    out = {}
    for k, v in weights.items():
        name = k[len(PREFIX):]
        if raw_hf and v.ndim == 1 and name.endswith("norm.weight"):
            v = v + 1.0
        out[name] = v
    for key in [k for k in out if k.endswith(".experts.gate_up_proj")]:
        base = key.removesuffix(".experts.gate_up_proj")
        gate_up = out.pop(key)
        mid = gate_up.shape[-2] // 2
        out[f"{base}.switch_mlp.gate_proj.weight"] = gate_up[..., :mid, :]
        out[f"{base}.switch_mlp.up_proj.weight"] = gate_up[..., mid:, :]
        out[f"{base}.switch_mlp.down_proj.weight"] = out.pop(f"{base}.experts.down_proj")
    for key in [k for k in out if k.endswith(".experts.0.gate_proj.weight")]:
        base = key.removesuffix(".experts.0.gate_proj.weight")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names = sorted((k for k in out if k.startswith(f"{base}.experts.")
                            and k.endswith(f".{proj}.weight")),
                           key=lambda k: int(k.split(".experts.")[1].split(".")[0]))
            out[f"{base}.switch_mlp.{proj}.weight"] = mx.stack([out.pop(k) for k in names])
    return out


class QwenMtp:
    """The target model plus its MTP head: satisfies
    :class:`mlxbun_core.contract.TokenPredictor`."""

    def __init__(self, model: Any, head: Any, num_draft_tokens: int, name: str,
                 pre_norm: bool = True):
        self.model, self.head = model, head
        self.num_draft_tokens, self.name = num_draft_tokens, name
        self.text = model.language_model
        self.pre_norm = pre_norm

    def _logits(self, out: Any) -> Any:
        text = self.text
        if text.args.tie_word_embeddings:
            return text.model.embed_tokens.as_linear(out)
        return text.lm_head(out)

    def forward(self, tokens: Any, cache: list[Any]) -> tuple[Any, Any]:
        """The target's forward: its logits and the hidden states the head reads."""
        normed = self.text.model(tokens, cache)
        hidden = normed / self.text.model.norm.weight if self.pre_norm else normed
        return self._logits(normed), hidden

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import KVCache

        return [KVCache()]

    def predict(self, hidden: Any, tokens: Any, cache: list[Any]) -> tuple[Any, Any]:
        """Rows pairing ``hidden[:, i]`` with the token after it, ``tokens[:, i]``, appended
        to the head's ``cache``: each row's logits (for the token after that) and the
        hidden state a chained draft reads."""
        out = self.head(hidden, self.text.model.embed_tokens(tokens), cache[0])
        return self._logits(out), out


def load_predictor(model: Any) -> QwenMtp | None:
    """The MTP drafter of a loaded Qwen3.5 model (None when its files carry no head, or a
    head this loader cannot read: logged, and the model serves without it)."""
    files = mtp_weight_files(Path(model.path))
    if not files:
        return None
    try:
        return _load(model, files)
    except Exception:
        log.warning("the checkpoint's mtp.* head could not be loaded; serving without it",
                    exc_info=True)
        return None


def _load(model: Any, files: list[Path]) -> QwenMtp:
    import mlx.core as mx
    import mlx.nn as nn

    weights: dict[str, Any] = {}
    for f in files:
        weights.update((k, v) for k, v in mx.load(str(f)).items() if k.startswith(PREFIX))
    raw_hf = _raw_hf(Path(model.path))
    args = model.model.language_model.args
    head = _head_class()(args)
    text_q = model.config.get("quantization") or model.config.get("quantization_config")
    if any(k.endswith(".scales") for k in weights) and isinstance(text_q, dict):
        nn.quantize(head, group_size=text_q.get("group_size", 64), bits=text_q.get("bits", 4),
                    class_predicate=lambda p, m: f"{PREFIX}{p}.scales" in weights)
    head.load_weights(list(_sanitize(weights, raw_hf).items()), strict=True)
    head.eval()
    pre = os.environ.get("MLXBUN_MTP_HIDDEN", "pre") != "post"
    return QwenMtp(model.model, head, DEFAULT_DRAFT_TOKENS, f"{model.id} (mtp head)", pre)


def _raw_hf(path: Path) -> bool:
    """Whether the checkpoint is HF's own layout (its conv1d kernels not yet transposed by
    mlx-lm), whose zero-centred norms need the ``+1``. ``mx.load`` is lazy: only shapes
    are read here."""
    import mlx.core as mx

    for f in sorted(path.glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            if "conv1d.weight" in k:
                return bool(v.shape[-1] != 1)
    return True
