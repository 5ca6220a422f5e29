"""Loading a MoE model with its routed experts streamed (see :mod:`.cache`).

The operator's budget arrives as ``options.extra["expert_budget"]`` (bytes; the
``serve --expert-budget`` flag or ``MLXBUN_EXPERT_BUDGET``); ``--expert-offload`` alone
(``options.extra["expert_offload"]``) streams with a budget of one token's experts in every
MoE layer (``num_experts_per_tok`` of the largest), about the active parameters. Without
either the model loads whole, exactly as before. Any mlx-lm model whose MoE layers keep
their routed experts in a ``SwitchGLU`` at ``mlp.switch_mlp`` or
``block_sparse_moe.switch_mlp`` streams (GLM-5.x, qwen3_moe, mixtral, ...).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..family import load_mlx_lm
from ..model import LoadedModel
from ..runconfig import current
from . import ExpertsUnsupported
from .cache import ExpertCache, ExpertIndex, ExpertReader

PROJS = ("gate_proj", "up_proj", "down_proj")
_EMPTY = mx.zeros((0,))


@dataclass
class _Wiring:
    """What a streamed layer uses but must not own as parameters: nn.Module keeps plain
    objects as attributes, but arrays, dicts, lists and modules in its parameter tree."""

    shell: nn.Module  # mlx-lm's (Quantized)SwitchGLU, its expert tensors emptied
    cache: ExpertCache
    parts: dict[str, list[str]]  # projection -> its tensors ("weight", "scales", ...)
    next_layer: int | None
    next_guess: Callable[[mx.array], mx.array | None] | None  # the next layer's router


class StreamedSwitchGLU(nn.Module):
    """Stands in for a MoE layer's ``switch_mlp``: same call, experts from the cache."""

    def __init__(self, shell: nn.Module, layer: int, n_experts: int, cache: ExpertCache,
                 parts: dict[str, list[str]], next_layer: int | None,
                 next_guess: Callable[[mx.array], mx.array | None] | None):
        super().__init__()
        self.layer, self.n_experts = layer, n_experts
        self._s = _Wiring(shell, cache, parts, next_layer, next_guess)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        s = self._s
        guess = s.next_guess(x) if s.next_guess is not None else None
        mx.eval(indices if guess is None else [indices, guess])
        ids = np.array(indices)
        groups = s.cache.plan(self.layer, np.unique(ids).tolist())
        first = s.cache.fetch(self.layer, groups[0])
        if guess is not None and s.next_layer is not None:
            # read while this layer's experts and the next layer's attention compute
            s.cache.prefetch(s.next_layer, np.unique(np.array(guess)).tolist())
        if len(groups) == 1:
            return self._run(x, ids, groups[0], first)
        return self._run_in_groups(x, ids, groups, first)

    def _run(self, x: mx.array, ids: np.ndarray, experts: list[int],
             weights: list) -> mx.array:
        """mlx-lm's SwitchGLU over a compact stack of ``experts`` (ids remapped)."""
        s = self._s
        lut = np.zeros(self.n_experts, dtype=np.uint32)
        lut[experts] = np.arange(len(experts), dtype=np.uint32)
        for proj, parts in s.parts.items():
            mod = getattr(s.shell, proj)
            for part in parts:
                mod[part] = mx.stack([w[f"{proj}.{part}"] for w in weights])
        out = s.shell(x, mx.array(lut[ids]))
        for proj, parts in s.parts.items():  # the graph keeps what it needs; we keep nothing
            for part in parts:
                getattr(s.shell, proj)[part] = _EMPTY
        return out

    def _run_in_groups(self, x: mx.array, ids: np.ndarray, groups: list[list[int]],
                       first: list) -> mx.array:
        """A step needing more experts than the budget holds (a long prefill): one
        budget-sized group at a time, each evaluated before the next is read, so expert
        memory stays within the budget. Each (token, slot) row is computed once."""
        k, dim = ids.shape[-1], x.shape[-1]
        flat, xs = ids.reshape(-1), x.reshape(-1, dim)
        out: mx.array | None = None
        for n, group in enumerate(groups):
            weights = first if n == 0 else self._s.cache.fetch(self.layer, group)
            rows = np.nonzero(np.isin(flat, group))[0]
            y = self._run(xs[mx.array(rows // k)], flat[rows][:, None], group, weights)
            if out is None:
                out = mx.zeros((flat.size, y.shape[-1]), dtype=y.dtype)
            out[mx.array(rows)] = y[:, 0, :]
            mx.eval(out)
        assert out is not None
        return out.reshape(*ids.shape, out.shape[-1])


def moe_block(layer: nn.Module) -> nn.Module | None:
    """A decoder layer's MoE block: the one holding mlx-lm's ``switch_mlp`` (None: dense)."""
    for name in ("mlp", "block_sparse_moe"):
        block = getattr(layer, name, None)
        if block is not None and hasattr(block, "switch_mlp"):
            return block
    return None


def router_guess(block: nn.Module) -> Callable[[mx.array], mx.array | None]:
    """The experts ``block``'s router would pick for ``x``: a DeepSeek-style gate's indices,
    or the top-k of a linear router's logits (None where k is unknown)."""
    gate = block.gate
    k = getattr(block, "top_k", None) or getattr(block, "num_experts_per_tok", None)

    def guess(x: mx.array) -> mx.array | None:
        out = gate(x)
        if isinstance(out, tuple):  # (indices, scores)
            return out[0]
        if not k:
            return None
        return mx.argpartition(-out, kth=int(k) - 1, axis=-1)[..., :int(k)]

    return guess


def install(model: nn.Module, cache: ExpertCache, index: ExpertIndex,
            prefetch: bool = True) -> list[int]:
    """Swap every MoE layer's experts for a streamed stand-in; the MoE layer ids.

    Runs on the lazily loaded model, so the dropped expert tensors are never read.
    """
    layers = model.model.layers
    blocks = {i: b for i, layer in enumerate(layers) if (b := moe_block(layer)) is not None}
    moe = sorted(blocks)
    for pos, i in enumerate(moe):
        block = blocks[i]
        shell = block.switch_mlp
        n_experts = shell.gate_proj.weight.shape[0]
        parts = {p: sorted(getattr(shell, p).parameters()) for p in PROJS}
        names = {f"{p}.{part}" for p, ps in parts.items() for part in ps}
        for e in range(n_experts):
            have = set(index.parts.get((i, e), {}))
            if have != names:
                raise ValueError(f"layer {i} expert {e}: the checkpoint has {sorted(have)}, "
                                 f"the model needs {sorted(names)}")
        for p, ps in parts.items():
            for part in ps:
                getattr(shell, p)[part] = _EMPTY
        nxt = moe[pos + 1] if prefetch and pos + 1 < len(moe) else None
        block.switch_mlp = StreamedSwitchGLU(
            shell, i, n_experts, cache, parts, nxt,
            router_guess(blocks[nxt]) if nxt is not None else None)
    return moe


@dataclass
class Streaming:
    """What ``/stats`` and ``/fit`` report about a streamed model."""

    cache: ExpertCache
    index: ExpertIndex
    moe_layers: list[int]
    main_layers: int


def asked(options: Any) -> int | None:
    """The expert budget the operator asked for: bytes (``--expert-budget``), 0 for
    ``--expert-offload`` alone (one token's experts), None when neither was given."""
    extra = getattr(options, "extra", None) or {}
    if extra.get("expert_budget"):
        return int(extra["expert_budget"])
    return 0 if extra.get("expert_offload") else None


def load_streamed(path: Path, config: dict, options: Any, budget: int,
                  **kw: Any) -> LoadedModel:
    """Load attention, shared and dense weights; leave routed experts on disk (``budget``
    0: one token's experts in every MoE layer)."""
    if getattr(options, "shard", None) is not None:
        raise ValueError("--expert-budget does not combine with --distributed")
    index = ExpertIndex.scan(path)
    main = int(config.get("num_hidden_layers", 0))
    sizes = [index.expert_bytes(k) for k in index.parts if k[0] < main]
    if not sizes:
        raise ExpertsUnsupported(f"{path}: no routed expert tensors to stream "
                                 "(--expert-offload and --expert-budget are for MoE "
                                 "checkpoints)")
    if not budget:
        layers = len({k[0] for k in index.parts if k[0] < main})
        budget = int(config.get("num_experts_per_tok") or 1) * max(sizes) * layers
    if budget < max(sizes):
        raise ValueError(f"expert budget {budget} bytes is below one expert "
                         f"({max(sizes)} bytes)")
    workers = current().families.expert_readers
    prefetch = current().families.expert_prefetch
    cache = ExpertCache(ExpertReader(index), budget, workers=workers)
    found: list[int] = []

    def drop_experts(model: nn.Module) -> None:
        found.extend(install(model, cache, index, prefetch=prefetch))

    loaded = load_mlx_lm(path, config, options, lazy_transform=drop_experts, **kw)
    loaded.extras["expert_streaming"] = Streaming(cache, index, found, main)
    weakref.finalize(loaded, cache.close)  # the read threads and file descriptors
    # admission bills the budget as weights: the cache may fill it
    loaded.extras["reserved_weight_bytes"] = budget
    return loaded
