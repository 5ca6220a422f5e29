"""Will a model fit: KV bytes per token, the memory plan, and a predicted decode rate.

Everything here except :func:`machine` is a pure function of a checkpoint's
``config.json``, its weight bytes and a memory budget, so start-up admission,
``GET /fit``, ``GET /library`` and ``mlxbun fit`` compute the same numbers.

The KV formula, per decoder layer (``e`` = bytes per cached element: 2 for
bf16/fp16, 4 for fp32, ``bits/8 + 2*e/group`` for a quantized cache)::

    full attention     tokens            x kv_heads x head_dim x 2 (K and V) x e
    sliding window     min(tokens, W)    x kv_heads x head_dim x 2 x e
    latent (MLA)       tokens x (kv_lora_rank + qk_rope_head_dim) x e
                       (+ tokens x index_head_dim x 2 x e for a sparse-attention indexer)
    linear attention   fixed: (conv_kernel - 1) x conv_dim x e_act
                              + v_heads x v_head_dim x k_head_dim x 4 (fp32 recurrent state)
    KV-shared layer    0 (reads an earlier layer's cache)

Layer kinds come from the config's schema (``layer_types``, ``sliding_window_pattern``,
``full_attention_interval``, ``num_kv_shared_layers``), never from a family name.
Full-attention layers of a config with ``global_head_dim`` / ``num_global_key_value_heads``
use those. Under a ``kv_bits`` scheme (``--kv-quant 4|8``, mlx-lm's ``kv_bits``) only the
full-attention layers mlx-lm can quantize are billed at the quantized ``e``: plain K/V
whose head dimension is a multiple of the group; sliding windows (a rotating cache),
latent (MLA) layers and recurrent state keep the activation dtype. The memory plan adds
the prefill transient (one prefill chunk of fp32 logits and MLP activations) to the
weights and the KV at a context length;
``max_safe_context`` is the longest context whose plan stays within the budget.

A multi-token-prediction head (Qwen3.5's ``mtp.*`` tensors) is planned in two ways. From
files alone (``mlxbun fit``, ``/library``, the model picker) the weights are every tensor in
the safetensors headers, so a head shipped in them is already counted: an upper bound, as
mlx-lm drops those tensors on load and a server holds them only once something drafts with
the head. Its cache is not billed there: the head's layer shape is its family's knowledge
(the plugin's ``TokenPredictor.kv_bytes_per_token``), and drafting with it is opt-in per
request. A serving engine's admission is exact instead: the loaded target's parameters, the
head's weights added once they are resident, and its cache through
``plan(extra_bytes_per_token=...)`` for rows that draft with it.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import asdict, dataclass, field, replace

from ..models.facts import activation_bytes, activation_dtype, text_config
from .checkpoint import context_window

log = logging.getLogger("mlxbun.fit")

PREFILL_CHUNK = 2048  # mlx-lm's generate_step prefill step
DECODE_EFFICIENCY = 0.8  # share of peak bandwidth a decode step achieves (peak tables only)
NO_LIMIT_CONTEXT = 1 << 24  # search ceiling when the config names no context length

__all__ = ["KVLayout", "MemoryPlan", "Machine", "text_config", "activation_bytes",
           "activation_dtype",
           "kv_element_bytes", "kv_layout", "quantizable", "kv_bytes_per_token", "plan",
           "machine", "predicted_decode_tps", "context_window", "BatchPlan", "batch_plan"]


KVBits = int | tuple[tuple[int, int] | None, ...] | None
"""Uniform bits, per-layer ``(bits, group)`` (None: unquantized), or no quantization."""


def kv_element_bytes(dtype_bytes: int = 2, bits: int | None = None, group_size: int = 64) -> float:
    """Bytes per cached K/V element: the activation dtype, or a ``bits``-bit quantized cache
    (mlx-lm's QuantizedKVCache keeps a scale and a bias per group in the activation dtype)."""
    if not bits:
        return float(dtype_bytes)
    return bits / 8 + 2 * dtype_bytes / group_size


@dataclass(frozen=True)
class KVLayout:
    """What a model's cache costs as the context grows."""

    full_bytes_per_token: float  # every unbounded layer, summed
    windows: tuple = ()  # ((window_tokens, bytes_per_token), ...) of sliding layers
    fixed_bytes: int = 0  # recurrent state, independent of length
    layers: dict = field(default_factory=dict)  # layer count per kind
    quantized_layers: int = 0  # full-attention layers billed at the quantized size
    kv_bits: int | None = None

    def bytes_at(self, tokens: int) -> int:
        """Cache bytes holding ``tokens`` tokens of context."""
        tokens = max(0, int(tokens))
        total = self.full_bytes_per_token * tokens + self.fixed_bytes
        total += sum(per * min(tokens, w) for w, per in self.windows)
        return int(round(total))

    @property
    def bytes_per_token(self) -> float:
        """Marginal cost of one more token while every window still has room."""
        return self.full_bytes_per_token + sum(per for _, per in self.windows)

    def describe(self) -> dict:
        return {"bytes_per_token": self.bytes_per_token,
                "full_bytes_per_token": self.full_bytes_per_token,
                "windows": [{"window": w, "bytes_per_token": per} for w, per in self.windows],
                "fixed_bytes": self.fixed_bytes, "layers": dict(self.layers),
                "kv_bits": self.kv_bits, "quantized_layers": self.quantized_layers}


_KIND = {"full_attention": "full", "attention": "full", "global": "full",
         "sliding_attention": "sliding", "local": "sliding", "sliding": "sliding",
         "linear_attention": "linear"}


def _layer_kinds(t: dict) -> list[str]:
    n = int(t.get("num_hidden_layers") or 0)
    types = t.get("layer_types")
    window = t.get("sliding_window")
    if isinstance(types, list) and len(types) >= n:
        kinds = [_KIND.get(str(x), "full") for x in types[:n]]
    elif t.get("sliding_window_pattern") and window:
        p = int(t["sliding_window_pattern"])
        kinds = ["full" if i % p == p - 1 else "sliding" for i in range(n)]
    elif t.get("full_attention_interval") and t.get("linear_num_value_heads"):
        k = int(t["full_attention_interval"])
        kinds = ["full" if (i + 1) % k == 0 else "linear" for i in range(n)]
    else:
        kinds = ["full"] * n
    if not window:
        kinds = ["full" if k == "sliding" else k for k in kinds]
    shared = int(t.get("num_kv_shared_layers") or 0)
    for i in range(max(0, n - shared), n):
        kinds[i] = "shared"
    return kinds


def _attention_bytes(t: dict, kind: str, e: float) -> float:
    """Per-token bytes of one attention layer's cache."""
    if t.get("kv_lora_rank"):
        per = (t["kv_lora_rank"] + (t.get("qk_rope_head_dim") or 0)) * e
        if t.get("index_head_dim"):
            per += 2 * t["index_head_dim"] * e  # indexer keys + mlx-lm's zero values
        return per
    heads = t.get("num_attention_heads") or 1
    kvh = t.get("num_key_value_heads") or heads
    hd = t.get("head_dim") or (t.get("hidden_size", 0) // heads)
    if kind == "full":
        hd = t.get("global_head_dim") or hd
        if t.get("attention_k_eq_v") and t.get("num_global_key_value_heads"):
            kvh = t["num_global_key_value_heads"]
    return kvh * hd * 2 * e


def quantizable(t: dict, kind: str, group_size: int = 64) -> bool:
    """Whether mlx-lm quantizes this layer's cache under ``kv_bits``: plain full-attention
    K/V (a ``KVCache``) whose head dimension divides into groups."""
    if kind != "full" or t.get("kv_lora_rank"):
        return False
    heads = t.get("num_attention_heads") or 1
    hd = t.get("global_head_dim") or t.get("head_dim") or (t.get("hidden_size", 0) // heads)
    return bool(hd) and hd % group_size == 0


def _linear_state_bytes(t: dict, act: int) -> int:
    """Fixed state of a gated-delta linear-attention layer: conv tail + fp32 recurrence."""
    kh, kd = t.get("linear_num_key_heads") or 0, t.get("linear_key_head_dim") or 0
    vh, vd = t.get("linear_num_value_heads") or 0, t.get("linear_value_head_dim") or 0
    conv_dim = 2 * kh * kd + vh * vd
    conv = max(0, (t.get("linear_conv_kernel_dim") or 1) - 1) * conv_dim * act
    return int(conv + vh * vd * kd * 4)


def kv_layout(config: dict, element_bytes: float | None = None, *,
              kv_bits: KVBits = None, group_size: int = 64) -> KVLayout:
    """The cache cost of ``config`` at ``element_bytes`` per K/V element (default: its dtype);
    with ``kv_bits``, the layers mlx-lm quantizes cost the quantized size (module doc). A
    tuple of per-layer ``(bits, group)`` (a ``kv_config.json``) bills each layer its own."""
    t = text_config(config)
    act = activation_bytes(config)
    e = float(element_bytes if element_bytes is not None else act)
    full, fixed, quantized = 0.0, 0, 0
    windows: dict[int, float] = {}  # window tokens -> bytes per token
    counts: dict[str, int] = {}  # layer kind -> layers
    for i, kind in enumerate(_layer_kinds(t)):
        counts[kind] = counts.get(kind, 0) + 1
        bits, group = _layer_bits(kv_bits, i, group_size)
        if kind == "full":
            q = bool(bits) and quantizable(t, kind, group)
            quantized += q
            full += _attention_bytes(t, kind, kv_element_bytes(act, bits, group) if q else e)
        elif kind == "sliding":
            w = int(t["sliding_window"])
            windows[w] = windows.get(w, 0.0) + _attention_bytes(t, kind, e)
        elif kind == "linear":
            fixed += _linear_state_bytes(t, act)
    return KVLayout(full, tuple(sorted(windows.items())), fixed, counts, quantized,
                    kv_bits if quantized and isinstance(kv_bits, int) else None)



def _layer_bits(kv_bits: KVBits, layer: int, group_size: int) -> tuple[int | None, int]:
    if isinstance(kv_bits, tuple):
        chosen = kv_bits[layer] if layer < len(kv_bits) else None
        return chosen if chosen else (None, group_size)
    return kv_bits, group_size


def kv_bytes_per_token(config: dict, element_bytes: float | None = None, *,
                       kv_bits: KVBits = None) -> float:
    """Marginal KV bytes per token below every sliding window (see the module formula)."""
    return kv_layout(config, element_bytes, kv_bits=kv_bits).bytes_per_token


def transient_bytes(config: dict, tokens: int, chunk: int = PREFILL_CHUNK) -> int:
    """Peak scratch of one prefill chunk: fp32 logits over the vocabulary plus
    the widest MLP activation, four buffers deep."""
    t = text_config(config)
    vocab = t.get("vocab_size") or config.get("vocab_size") or 0
    width = max(t.get("hidden_size") or 0, t.get("intermediate_size") or 0,
                t.get("moe_intermediate_size") or 0)
    return int(min(max(tokens, 1), chunk) * (vocab + 4 * width) * 4)


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int
    kv: KVLayout
    usable_bytes: int
    context_tokens: int  # the context this plan was assessed at
    kv_bytes: int
    transient_bytes: int
    total_bytes: int
    max_safe_context: int
    context_window: int | None
    fits: bool

    def report(self) -> dict:
        d = asdict(self)
        d["kv"] = self.kv.describe()
        d["kv_bytes_per_token"] = self.kv.bytes_per_token
        return d


def _need(config, kv: KVLayout, weights: int, tokens: int) -> int:
    return weights + kv.bytes_at(tokens) + transient_bytes(config, tokens)


def plan(config: dict, weights_bytes: int, budget_bytes: int, *, context: int | None = None,
         element_bytes: float | None = None, kv_bits: KVBits = None,
         extra_bytes_per_token: float = 0) -> MemoryPlan:
    """The memory plan of ``config`` with ``weights_bytes`` of weights under ``budget_bytes``.

    ``max_safe_context`` is the largest context (capped at the config's trained
    length) with weights + KV + prefill transient within the budget; 0 when not even
    one token fits. ``context`` (default: that maximum, or the trained length when
    nothing fits) is the length the totals are reported at; ``fits`` says whether it fits.
    ``kv_bits`` bills a quantized KV cache (``--kv-quant``); ``extra_bytes_per_token`` a
    cache kept beside the model's at every position (an MTP head's), in the plan's ``kv``.
    """
    kv = kv_layout(config, element_bytes, kv_bits=kv_bits)
    if extra_bytes_per_token:
        kv = replace(kv, full_bytes_per_token=kv.full_bytes_per_token + extra_bytes_per_token)
    window = context_window(config)
    hi = window or NO_LIMIT_CONTEXT
    lo = 0
    if _need(config, kv, weights_bytes, 1) <= budget_bytes:
        lo = 1
        while lo < hi:  # largest tokens with need <= budget (need grows with tokens)
            mid = (lo + hi + 1) // 2
            if _need(config, kv, weights_bytes, mid) <= budget_bytes:
                lo = mid
            else:
                hi = mid - 1
    at = context if context is not None else (lo or window or PREFILL_CHUNK)
    kvb, tb = kv.bytes_at(at), transient_bytes(config, at)
    total = weights_bytes + kvb + tb
    return MemoryPlan(weights_bytes, kv, budget_bytes, at, kvb, tb, total, lo, window,
                      fits=lo > 0 and at <= lo)


# ---------------------------------------------------------------- the default batch

BATCH_MIN, BATCH_MAX = 4, 64
TYPICAL_CONTEXT = 4096  # tokens of KV a row is assumed to hold when sizing the default
CPU_BATCH = 4  # a CPU decode step is compute-bound: more rows split the same tok/s
DISTRIBUTED_BATCH = 32  # as mlx_lm.server's decode concurrency: ranks' round trips bound a step
CUDA_QUANTIZED_BATCH = 8  # batched quantized matmul on CUDA: 32 rows ran at 0.16x of bf16


@dataclass(frozen=True)
class BatchPlan:
    """The default ``--batch``: rows whose KV at a typical context fits the memory left
    after the weights, capped by what the device gains from more rows, clamped to
    ``BATCH_MIN..BATCH_MAX``."""

    rows: int
    memory_rows: int  # rows of ``context`` tokens the KV room holds
    device_rows: int  # the device's cap
    context: int
    row_bytes: int
    reason: str

    def describe(self) -> dict:
        return asdict(self)


def batch_plan(kv: KVLayout, kv_room_bytes: int, *, backend: str, quantized: bool,
               context: int = TYPICAL_CONTEXT, ranks: int = 1) -> BatchPlan:
    """``backend``: "cpu", "cuda" or "metal"; ``quantized``: the weights are; ``ranks``: the
    processes of a distributed serve (each step then waits on collectives between them, so
    a wider batch costs little even where one process's decode is compute-bound)."""
    row = max(1, kv.bytes_at(max(1, context)))
    memory_rows = max(0, int(kv_room_bytes // row))
    if ranks > 1 and backend == "cpu":
        device_rows, why = DISTRIBUTED_BATCH, f"{ranks} ranks: each step waits on collectives"
    elif backend == "cpu":
        device_rows, why = CPU_BATCH, "CPU backend: decode is compute-bound"
    elif backend == "cuda" and quantized:
        device_rows, why = CUDA_QUANTIZED_BATCH, "quantized weights on CUDA batch poorly"
    else:
        device_rows, why = BATCH_MAX, f"{backend}: bandwidth-bound decode"
    rows = max(BATCH_MIN, min(BATCH_MAX, device_rows, memory_rows))
    if memory_rows < device_rows:
        why = f"KV of {memory_rows} rows at {context} tokens fits the memory left"
    if rows > min(device_rows, memory_rows):
        why += f"; at least {BATCH_MIN} (admission holds back rows that do not fit)"
    return BatchPlan(rows, memory_rows, device_rows, context, row, why)


def predicted_decode_tps(active_weight_bytes: int, kv_bytes: int, bandwidth_gbs: float,
                         efficiency: float = 1.0) -> float:
    """Decode is memory-bound: each token streams the active weights and the live KV once,
    at the effective decode bandwidth (a peak figure: pass ``efficiency``)."""
    moved = active_weight_bytes + kv_bytes
    if moved <= 0 or not bandwidth_gbs:
        return 0.0
    return round(bandwidth_gbs * 1e9 * efficiency / moved, 2)


# ---------------------------------------------------------------- the machine

@dataclass(frozen=True)
class Machine:
    device: str  # "gpu" (Metal or CUDA) or "cpu"
    name: str
    total_bytes: int
    usable_bytes: int  # what MLX lets this process allocate
    bandwidth_gbs: float  # effective decode bandwidth (see .bandwidth)
    bandwidth_source: str  # "measured", "env", "table" or "unknown"
    bandwidth_note: str = ""  # what the prediction assumed, in words

    def describe(self) -> dict:
        return {"device": self.device, "chip": self.name, "ram_bytes": self.total_bytes,
                "usable_bytes": self.usable_bytes, "bandwidth_gbs": self.bandwidth_gbs,
                "bandwidth_source": self.bandwidth_source,
                "bandwidth_note": self.bandwidth_note}


def system_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


@functools.lru_cache(maxsize=2)
def machine(probe_mlx: bool = True) -> Machine:
    """This machine as MLX sees it: Metal's recommended working set, else MLX's memory
    limit (CUDA, or 80% of RAM on the CPU backend). ``probe_mlx=False`` (the isolation
    parent, which never touches MLX) reports system RAM only."""
    ram = system_ram_bytes()
    name, device, usable, total = os.uname().machine, "cpu", ram, ram
    if probe_mlx:
        import mlx.core as mx

        info = mx.device_info()
        name = str(info.get("device_name") or info.get("architecture") or name)
        total = int(info.get("memory_size") or info.get("total_memory") or ram)
        device = "gpu" if mx.default_device() == mx.gpu else "cpu"
        usable = int(info.get("max_recommended_working_set_size") or mx.get_memory_limit() or total)
        usable = min(usable, total) if total else usable
    from .bandwidth import decode_bandwidth

    bw = decode_bandwidth(device, name, probe_mlx=probe_mlx)
    return Machine(device, name, total, usable, bw.gbs, bw.source, bw.note)
