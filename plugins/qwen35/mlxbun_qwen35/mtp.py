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

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxbun_core.contract import LazyHeadPredictor, load_head_weights
from mlxbun_core.models.facts import activation_bytes
from mlxbun_core.runconfig import current

from . import mtp_weights as W

log = logging.getLogger("mlxbun.qwen35")

DEFAULT_DRAFT_TOKENS = 2  # Qwen's recommended speculative depth for its MTP head


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

        def __call__(self, hidden: mx.array, embeds: mx.array,
                     cache: Any) -> tuple[mx.array, mx.array]:
            x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeds),
                                        self.pre_fc_norm_hidden(hidden)], axis=-1))
            x = self.layers[0](x, create_attention_mask(x, cache), cache)
            out: mx.array = self.norm(x)
            return out, out  # a chained draft reads the normed output, as the logits do

    return MtpHead


class QwenMtp(LazyHeadPredictor):
    """The target model plus its MTP head, read on first use."""

    def __init__(self, model: Any, load_head: Callable[[], Any], num_draft_tokens: int,
                 name: str, pre_norm: bool = True, dtype_bytes: int = 2, weight_bytes: int = 0):
        """``dtype_bytes``: the activation dtype's size, which the head's K/V are kept in;
        ``weight_bytes``: the head's tensors' bytes as the files store them (the head
        loads them as stored, so that is what it holds: memory admission bills it)."""
        self.text = model.language_model
        super().__init__(self.text.model, load_head, name=name,
                         num_draft_tokens=num_draft_tokens,
                         kv_bytes_per_token=head_kv_bytes_per_token(self.text.args, dtype_bytes),
                         weight_bytes=weight_bytes)
        self.model, self.pre_norm = model, pre_norm

    def logits(self, normed: Any) -> Any:
        text = self.text
        if text.args.tie_word_embeddings:
            return text.model.embed_tokens.as_linear(normed)
        return text.lm_head(normed)

    def head_input(self, normed: Any) -> Any:
        """The last layer's output before the final norm (see the module's docstring)."""
        return normed / self.backbone.norm.weight if self.pre_norm else normed

    def head_cache(self) -> list[Any]:
        from mlx_lm.models.cache import KVCache

        return [KVCache()]


def head_kv_bytes_per_token(args: Any, dtype_bytes: int) -> int:
    """What the head's one full-attention layer caches per token: K and V, each
    ``num_key_value_heads x head_dim`` elements (memory admission bills it)."""
    return int(args.num_key_value_heads * args.head_dim * 2 * dtype_bytes)


REQUIRED = ("mtp.fc.", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
            "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.")


def load_predictor(model: Any) -> QwenMtp | None:
    """The MTP drafter of a loaded Qwen3.5 model (None when its files carry no head, or an
    incomplete one: logged, and the model serves without it). Only file headers are read
    here; the weights on first use."""
    path = Path(model.path)
    files = W.weight_files(path)
    if not files:
        return None
    tensors = {k: v for f in files for k, v in W.header(f)[0].items()
               if k.startswith(W.PREFIX)}
    missing = [r for r in REQUIRED if not any(n.startswith(r) for n in tensors)]
    if missing:
        log.warning("the checkpoint's mtp head lacks %s; serving without it", missing)
        return None
    pre = current().families.mtp_hidden != "post"
    return QwenMtp(model.model, lambda: _load_head(model, files), DEFAULT_DRAFT_TOKENS,
                   f"{model.id} (mtp head)", pre, activation_bytes(model.config or {}),
                   W.tensor_bytes(tensors))


def _load_head(model: Any, files: list[Path]) -> Any:
    weights = W.sanitize(W.read(files), W.raw_hf(Path(model.path)))
    return load_head_weights(_head_class()(model.model.language_model.args), weights,
                             model.config or {})
