"""``mtp.*`` weights for a tiny Qwen3.5 checkpoint (the multi-token-prediction head
published Qwen3.5 / Qwen3-Next checkpoints carry, in their HF layout).

``"random"``: random weights like the rest of the checkpoint (drafts rarely land).
``"copy"``: a head built to propose "the token just given again": ``fc`` passes the
token's embedding through and drops the hidden state, the decoder layer adds nothing
(zero ``o_proj`` and ``down_proj``), so with tied embeddings the logits are
``E @ E[t]`` and random embeddings make ``t`` itself the argmax. A tiny random model
that falls into repeating a token then sees most drafts accepted, which exercises the
accept path, not only rejections.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx

from .weights import random_params

MODES = ("random", "copy")


def mtp_weights(config: dict[str, Any], seed: int, dtype: mx.Dtype,
                mode: str) -> dict[str, mx.array]:
    """The head's tensors under HF names (zero-centred norms, as HF stores them)."""
    from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

    if mode not in MODES:
        raise ValueError(f"mtp must be one of {MODES}")
    args = TextModelArgs.from_dict(copy.deepcopy(config.get("text_config", config)))
    hidden = args.hidden_size
    layer = DecoderLayer(args, args.full_attention_interval - 1)
    out = {f"mtp.layers.0.{k}": v for k, v in random_params(layer, seed + 7, dtype).items()}
    key = mx.random.key(seed + 11)
    out["mtp.fc.weight"] = (mx.random.normal((hidden, 2 * hidden), key=key)
                            * (2 * hidden) ** -0.5).astype(dtype)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{name}.weight"] = mx.ones((hidden,), dtype=dtype)
    if mode == "copy":
        eye = mx.eye(hidden, dtype=dtype)
        out["mtp.fc.weight"] = mx.concatenate([eye, mx.zeros_like(eye)], axis=1)
        for k in list(out):
            if k.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight",
                           "switch_mlp.down_proj.weight", "shared_expert.down_proj.weight")):
                out[k] = mx.zeros_like(out[k])
    for k in [k for k in out if k.endswith(".switch_mlp.gate_proj.weight")]:  # MoE: HF fuses
        base = k.removesuffix(".switch_mlp.gate_proj.weight")
        up = out.pop(f"{base}.switch_mlp.up_proj.weight")
        out[f"{base}.experts.gate_up_proj"] = mx.concatenate([out.pop(k), up], axis=-2)
        out[f"{base}.experts.down_proj"] = out.pop(f"{base}.switch_mlp.down_proj.weight")
    # HF stores RMSNorm weights zero-centred (mlx-lm adds the 1 back)
    return {k: (v - 1.0 if v.ndim == 1 and k.endswith("norm.weight") else v)
            for k, v in out.items()}


def glm_mtp_weights(config: dict[str, Any], seed: int, dtype: mx.Dtype, mode: str,
                    main: dict[str, mx.array]) -> dict[str, mx.array]:
    """GLM-5.x's MTP layer ``model.layers.{N}`` in HF layout (DeepSeek-V3's: ``enorm``,
    ``hnorm``, ``eh_proj``, a decoder layer, ``shared_head``, copies of the embeddings and
    head). ``"copy"`` zeroes the layer's outputs and passes the token's embedding through,
    and ties the checkpoint's ``lm_head`` to its embeddings (``main`` is changed), so the
    head proposes the token it was given, as the Qwen head's ``"copy"`` does."""
    from mlx_lm.models.deepseek_v32 import DeepseekV32DecoderLayer
    from mlx_lm.models.glm_moe_dsa import ModelArgs

    from .hf_layout import to_hf

    if mode not in MODES:
        raise ValueError(f"mtp must be one of {MODES}")
    args = ModelArgs.from_dict(copy.deepcopy(config))
    n, hidden = args.num_hidden_layers, args.hidden_size
    layer = DeepseekV32DecoderLayer(args, n)
    pre = f"model.layers.{n}."
    out = {pre + k: v for k, v in random_params(layer, seed + 7, dtype).items()}
    key = mx.random.key(seed + 11)
    out[pre + "eh_proj.weight"] = (mx.random.normal((hidden, 2 * hidden), key=key)
                                   * (2 * hidden) ** -0.5).astype(dtype)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        out[f"{pre}{name}.weight"] = mx.ones((hidden,), dtype=dtype)
    if mode == "copy":
        eye = mx.eye(hidden, dtype=dtype)
        out[pre + "eh_proj.weight"] = mx.concatenate([eye, mx.zeros_like(eye)], axis=1)
        for k in list(out):
            if k.endswith(("self_attn.o_proj.weight", "down_proj.weight")):
                out[k] = mx.zeros_like(out[k])
        main["lm_head.weight"] = main["model.embed_tokens.weight"]
    out = to_hf("glm_moe_dsa", out, config)
    out[pre + "embed_tokens.weight"] = main["model.embed_tokens.weight"]
    out[pre + "shared_head.head.weight"] = main["lm_head.weight"]
    return out


class CopyPredictor:
    """A :class:`~mlxbun_core.contract.TokenPredictor` over a tied-embedding model (a tiny
    llama) whose "head" proposes the token it was given again; its cache only counts
    rows, so a loop's trims can be checked against it. Drives the MTP loops on caches
    that trim (full attention only)."""

    name, num_draft_tokens = "copy", 2
    kv_bytes_per_token = 8  # a float32 K and V row of one element each (predict)
    weight_bytes, loaded = 0, True  # no weights of its own

    def __init__(self, model: Any):
        self.model = model

    def forward(self, tokens: mx.array, cache: list[Any]) -> tuple[mx.array, mx.array]:
        hidden = self.model.model(tokens, cache=cache)
        return self.model.model.embed_tokens.as_linear(hidden), hidden  # tied embeddings

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import KVCache

        return [KVCache()]

    def predict(self, hidden: mx.array, tokens: mx.array,
                cache: list[Any]) -> tuple[mx.array, mx.array]:
        rows = mx.zeros((tokens.shape[0], 1, tokens.shape[1], 1))
        cache[0].update_and_fetch(rows, rows)
        vocab = self.model.model.embed_tokens.weight.shape[0]
        logits = mx.where(mx.arange(vocab) == tokens[:, -1:], 10.0, 0.0)  # (B, V)
        return logits, hidden


class BatchRun:
    """Rows decoded together on the engine's own batch (``engine/batch``) with an MTP tap
    (``engine/speculate/mtp_batch.py``), as the batch lane runs them, without a server.

    ``rows``: ``(tick, prompt, budget, depth)`` each; the row arrives at the lane step
    ``tick`` (a prefill pass and a decode step each), generates ``budget`` tokens
    greedily and drafts ``depth`` tokens a step with the head (None: a plain row).
    Prompts are read ``chunk`` tokens a pass; ``kv_bits``: the blocks' KV scheme."""

    def __init__(self, model: Any, predictor: Any, rows: list[tuple[int, list[int], int,
                                                                    int | None]],
                 chunk: int = 7, block_size: int = 4, kv_bits: int | None = None):
        from types import SimpleNamespace

        from ..engine.batch import Batch, BlockPool
        from ..engine.batch.layout import layout
        from ..engine.speculate.mtp_batch import MtpBatch
        from ..kvquant import KVScheme

        self.rows, self.chunk = rows, chunk
        self.mtp = MtpBatch(predictor)
        assert self.mtp.supported()
        slots = layout(model)
        assert slots is not None
        self.batch = Batch(model, slots, BlockPool(block_size, 8, 1 << 20), tap=self.mtp,
                           kv=KVScheme(kv_bits))
        self.out: list[list[int]] = [[] for _ in rows]
        self.usage = [SimpleNamespace(speculation=None) for _ in rows]
        self.steps = 0  # decode steps
        self.calls = [0] * len(rows)  # decode steps each row took part in
        self.read: dict[int, int] = {}  # head positions each MTP row held at its first step
        self.ends: dict[int, list[Any]] = {}  # each MTP row's head at its end (mlx-lm caches)

    def run(self) -> BatchRun:
        b, mtp = self.batch, self.mtp
        waiting, tick = list(range(len(self.rows))), 0
        while waiting or b.rows:
            for i in [i for i in waiting if self.rows[i][0] <= tick]:
                waiting.remove(i)
                _, prompt, budget, depth = self.rows[i]
                b.add(i, prompt, budget=budget, tapped=depth is not None)
                if depth is not None:
                    mtp.add(i, depth, None, self.usage[i])
            if b.prefilling:
                b.prefill({u: self.chunk for u in b.prefilling})
            for u in b.decoding:
                if u in mtp.rows and u not in self.read:
                    self.read[u] = mtp.pages.length(u)
            tick += 1
            if not b.decoding:
                continue
            self.steps += 1
            for u in b.decoding:
                self.calls[u] += 1
            emits = b.decode(drafts=mtp.drafts(b))
            for e in emits:
                self.out[e.uid].append(e.token)
                if e.drafted:
                    mtp.count(e.uid, e.drafted, e.accepted)
                if e.finish:
                    if e.uid in mtp.rows:
                        self.ends[e.uid] = mtp.pages.export(e.uid)
                    b.remove(e.uid)
                    mtp.drop(e.uid)
        return self
