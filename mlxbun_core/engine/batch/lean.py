"""A decode step over a llama-shaped model's own modules, with two-dimensional activations.

A decode step is bound by the host, not the device: at 32 rows of an 8B model an H100
waited 0.5 ms of a 12.75 ms step, while the host spent 3.6 ms building the graph and 8.5
ms handing MLX its primitives one by one (``bench/step_split.py``). mlx-lm's layers keep
activations as ``(rows, 1, hidden)``, so each of a layer's seven projections is four
primitives (the weight's transpose, a flatten, the matmul, an unflatten) and the heads
are reshaped and transposed around every norm and rotation; a 36-layer step is about
2,000 primitives where the arithmetic needs about 1,000.

:class:`LeanDecode` runs the same modules (the model's own norms, projections, rotary
embedding, MLP and attention function, called as mlx-lm calls them) on ``(rows,
hidden)`` activations and reads each plain projection's weight through a transposed
view made once. It takes only the layer classes whose source it mirrors (mlx-lm's
llama, qwen2 and qwen3; mistral checkpoints load as llama) and only width-1 passes; a
batch turns it on only after :func:`probe` saw it give the model's own logits; a lone
stream's one-token steps over mlx-lm's own ``KVCache`` after :func:`for_solo` did.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

from .direct import TOLERANCE, decode_both_ways, relative_error

log = logging.getLogger("mlxbun.engine")

# the mlx-lm modules whose model, block and attention classes are mirrored here
MIRRORED = {"mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3"}

ENABLED = True  # (a bench switch: engine_ab's "heavy" arm serves without it)
FUSE_MLP = False  # (a bench switch: step_split's --fuse-mlp; one gate-up matmul a layer)
# (engine/batch/tune.py decides between this step, its fused form and the model's call)


class LeanDecode:
    """The decode forward of ``model`` (see the module's docstring); call it as the
    batch's forward: ``(inputs (rows, 1), caches) -> logits (rows, 1, vocab)``."""

    def __init__(self, model: Any):
        self.model = model
        self._transposed: dict[int, tuple[mx.array, mx.array]] = {}
        self._gate_up: dict[int, tuple[mx.array, mx.array, mx.array]] = {}
        self.fused = False  # gate and up as one matmul where :meth:`fuse_gate_up` joined them

    @classmethod
    def of(cls, model: Any) -> LeanDecode | None:
        """The lean forward of ``model``, or None where its layers are not the ones
        mirrored here (a plugin's own classes, a pipelined or wrapped model)."""
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if not layers or not all(hasattr(inner, a) for a in ("embed_tokens", "norm")):
            return None
        if type(model).__module__ not in MIRRORED or type(inner).__module__ not in MIRRORED:
            return None
        if getattr(inner, "pipeline_size", 1) != 1:
            return None
        for layer in layers:
            attn = getattr(layer, "self_attn", None)
            if type(layer).__module__ not in MIRRORED or type(attn).__module__ not in MIRRORED:
                return None
        return cls(model)

    def __call__(self, inputs: mx.array, caches: list[Any]) -> mx.array:
        # (every module looked up per call: an adapter may have replaced one since. Child
        # modules and weights are read as the dict items a Module keeps them as: its
        # attribute fallback costs ~0.7 us a read in Python, ~1,000 reads a step)
        model, inner = self.model, self.model["model"]
        rows = inputs.shape[0]
        h = inner["embed_tokens"](inputs.reshape(rows))
        for layer, cache in zip(inner["layers"], caches):
            h = h + self._attention(layer["self_attn"],
                                    _normed(layer["input_layernorm"], h), cache)
            h = h + self._mlp(layer["mlp"], _normed(layer["post_attention_layernorm"], h))
        out = _normed(inner["norm"], h)
        head = model.get("lm_head")  # None: tied to the embedding
        logits = self._project(head, out) if head is not None \
            else inner["embed_tokens"].as_linear(out)
        return cast(mx.array, logits[:, None, :])

    def _attention(self, attn: Any, x: mx.array, cache: Any) -> mx.array:
        rows = x.shape[0]
        q = self._project(attn["q_proj"], x).reshape(rows, attn.n_heads, 1, -1)
        k = self._project(attn["k_proj"], x).reshape(rows, attn.n_kv_heads, 1, -1)
        v = self._project(attn["v_proj"], x).reshape(rows, attn.n_kv_heads, 1, -1)
        if "q_norm" in attn:  # qwen3: the heads normed before their rotation
            q, k = _normed(attn["q_norm"], q), _normed(attn["k_norm"], k)
        rope = attn["rope"]
        q = rope(q, offset=cache.offset)
        k = rope(k, offset=cache.offset)
        keys, values = cache.update_and_fetch(k, v)
        # (a paged pass's mask is made once for all layers, and direct attention ignores
        # it; mlx-lm's KVCache gives None for one token)
        mask = cache.make_mask(1, return_array=False, window_size=None)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=attn.scale,
                                                   mask=mask)
        return self._project(attn["o_proj"], out.reshape(rows, -1))

    def _mlp(self, mlp: Any, x: mx.array) -> mx.array:
        gate_proj, up_proj = mlp["gate_proj"], mlp["up_proj"]
        kept = self._gate_up.get(id(mlp)) if self.fused else None
        if kept is not None and kept[0] is gate_proj.get("weight") \
                and kept[1] is up_proj.get("weight"):
            both = x @ kept[2]  # (rows, 2 x intermediate): gate, then up
            inter = kept[0].shape[0]
            gate, up = both[:, :inter], both[:, inter:]
        else:
            gate, up = self._project(gate_proj, x), self._project(up_proj, x)
        return self._project(mlp["down_proj"], swiglu(gate, up))

    def fuse_gate_up(self) -> int:
        """Put each layer's plain gate and up weights in one buffer, the modules keeping
        views of its halves (no more memory than before), so a decode step may make one
        matmul of them (:attr:`fused`); return how many layers are joined. Layers joined
        before are left as they are."""
        fused = 0
        for layer in self.model.model.layers:
            mlp = layer.mlp
            kept = self._gate_up.get(id(mlp))
            if kept is not None and kept[0] is mlp["gate_proj"].get("weight") \
                    and kept[1] is mlp["up_proj"].get("weight"):
                fused += 1
                continue
            gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
            if type(gate) is not nn.Linear or type(up) is not nn.Linear \
                    or "bias" in gate or "bias" in up:
                continue
            both = mx.concatenate([gate.weight, up.weight], axis=0)
            mx.eval(both)
            inter = gate.weight.shape[0]
            gate.weight, up.weight = both[:inter], both[inter:]
            mx.eval(gate.weight, up.weight)
            self._gate_up[id(mlp)] = (gate.weight, up.weight, both.T)
            for old in (gate, up):  # (their old weights' transposed views let go)
                self._transposed.pop(id(old), None)
            fused += 1
        if fused:
            mx.clear_cache()  # the separate weights' buffers go back to the device
        return fused

    def _project(self, linear: Any, x: mx.array) -> mx.array:
        """``linear(x)``; a plain ``nn.Linear`` as one matmul against its weight's
        transposed view (made once, while that weight stays the module's)."""
        if type(linear) is not nn.Linear:  # quantized, LoRA, ...: its own call
            return cast(mx.array, linear(x))
        weight = linear["weight"]
        kept = self._transposed.get(id(linear))
        if kept is None or kept[0] is not weight:
            kept = self._transposed[id(linear)] = (weight, weight.T)
        bias = linear.get("bias")
        if bias is not None:
            return mx.addmm(bias, x, kept[1])
        return x @ kept[1]


def _normed(norm: Any, x: mx.array) -> mx.array:
    """``norm(x)``; a plain ``nn.RMSNorm`` as the one call its ``__call__`` makes."""
    if type(norm) is nn.RMSNorm:
        return mx.fast.rms_norm(x, norm["weight"], norm.eps)
    return cast(mx.array, norm(x))


def probe(batch: Any, made: LeanDecode | None = None) -> bool:
    """Set ``batch.lean`` to the model's lean forward where it may run (no tap, KV
    scheme or distributed journal: their passes are the model's own call) and gives the
    model's own logits on a scratch decode pass; return whether it does. Per-row adapters
    may ride on it: their layers take 2-D rows (``adapters/rows.py``). ``made``: the one
    an earlier batch over the same model used (its gate and up joined stay joined)."""
    batch.lean = None
    if not ENABLED or batch.tap is not None:
        return False
    if batch.layout.quantized or batch.layout.journal is not None:
        return False
    lean = made if made is not None and made.model is batch.model \
        else LeanDecode.of(batch.model)
    if lean is None:
        return False
    if FUSE_MLP:
        log.info("lean decode: gate and up fused in %d layers", lean.fuse_gate_up())
        lean.fused = True
    try:
        error = decode_both_ways(batch, [(batch.direct, batch.forward), (batch.direct, lean)])
    except Exception as exc:  # a model this mirror cannot drive: the model's own call
        log.info("lean decode off for this model (%s)", exc)
        return False
    if error is None or error > TOLERANCE:
        log.info("lean decode off for this model: logits differ by %s of their spread",
                 "?" if error is None else f"{error:.3g}")
        return False
    log.debug("decode steps may run lean (the model's own modules on 2-D activations)")
    batch.lean = lean
    return True


def for_solo(model: Any) -> LeanDecode | None:
    """The lean forward for a lone stream's one-token steps over mlx-lm's own caches
    (``lanes/solo.py``), or None: not mirrored here, switched off, or other logits than
    the model's on a scratch step (an 11-token prompt in two fresh caches, then one token
    each way). Steps may take it while :func:`plain_caches` holds."""
    if not ENABLED:
        return None
    lean = LeanDecode.of(model)
    if lean is None:
        return None
    from ... import cache_ops

    try:
        caches = [cache_ops.make(model) for _ in range(2)]
        if not plain_caches(caches[0]):
            return None
        prompt = mx.array([[1 + (7 * i) % 97 for i in range(11)]])
        for cache in caches:
            model(prompt, cache=cache)
        token = mx.array([[5]])
        want, got = model(token, cache=caches[0]), lean(token, caches[1])
        error = relative_error(want.astype(mx.float32), got.astype(mx.float32))
    except Exception as exc:  # a model this mirror cannot drive: the model's own call
        log.info("lean decode off for lone streams (%s)", exc)
        return None
    if error > TOLERANCE:
        log.info("lean decode off for lone streams: logits differ by %.3g of their spread",
                 error)
        return None
    return lean


def plain_caches(caches: list[Any]) -> bool:
    """Whether every layer's cache is mlx-lm's plain ``KVCache`` (the one the lean step
    writes as the model would; a quantized or rotating one takes the model's call)."""
    from mlx_lm.models.cache import KVCache

    return all(type(c) is KVCache for c in caches)
