"""One rank's share of a model served across ``N`` ranks (``mlxbun serve --distributed``).

What ``mlxbun fit --ranks N`` and a distributed serve's admission bill on each machine:

- weights: the sharded part split ``N`` ways, plus what every rank keeps whole (mlx-lm's
  ``shard()`` leaves the token embedding and the output head unsplit, and under pipeline
  parallelism every stage keeps them too);
- KV per token: tensor parallel splits the attention (and linear-attention) heads across
  ranks, pipeline parallel splits the layers; either way a rank holds about ``1/N`` of it.

It is arithmetic on ``config.json``: a config for one rank (:func:`rank_config`), read by
the same planner as a whole model's.
"""

from __future__ import annotations

import math
from typing import Any

# bytes per element of a checkpoint's dominant safetensors dtype
_ELEMENT = {"F32": 4.0, "BF16": 2.0, "F16": 2.0, "F8_E4M3": 1.0, "U32": 0.5, "U8": 0.5}


def rank_config(config: dict[str, Any], ranks: int, mode: str = "tensor") -> dict[str, Any]:
    """``config`` as one of ``ranks`` ranks sees it: heads (``tensor``) or layers
    (``pipeline``) divided, rounded up."""
    if ranks <= 1:
        return config
    out = dict(config)
    text = out.get("text_config")
    t = dict(text) if isinstance(text, dict) else out
    if mode == "pipeline":
        layers = int(t.get("num_hidden_layers") or 0)
        per = math.ceil(layers / ranks)
        t["num_hidden_layers"] = per
        if isinstance(t.get("layer_types"), list):
            t["layer_types"] = t["layer_types"][:per]
    else:
        heads = t.get("num_attention_heads")
        if heads:
            t.setdefault("head_dim", int(t.get("hidden_size", 0)) // int(heads))
            t["num_attention_heads"] = math.ceil(int(heads) / ranks)
        for key in ("num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads"):
            if t.get(key):
                t[key] = math.ceil(int(t[key]) / ranks)
    if t is not out:
        out["text_config"] = t
    return out


def replicated_bytes(config: dict[str, Any], dtypes: dict[str, int]) -> int:
    """Bytes every rank keeps whole: the token embedding and an untied output head."""
    text = config.get("text_config")
    t = text if isinstance(text, dict) else config
    vocab = int(t.get("vocab_size") or config.get("vocab_size") or 0)
    hidden = int(t.get("hidden_size") or 0)
    dominant = max(dtypes, key=lambda k: dtypes[k]) if dtypes else "BF16"
    tied = t.get("tie_word_embeddings", config.get("tie_word_embeddings", True))
    return int(vocab * hidden * _ELEMENT.get(dominant, 2.0) * (1 if tied else 2))


def rank_weight_bytes(total: int, replicated: int, ranks: int) -> int:
    """One rank's weights: the split part's share plus the replicated part."""
    if ranks <= 1:
        return total
    replicated = min(replicated, total)
    return math.ceil((total - replicated) / ranks) + replicated
