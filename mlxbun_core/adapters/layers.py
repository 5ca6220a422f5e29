"""The modules that carry LoRA residuals while an adapter set is active.

They replace target layers only while a set is active (the base path keeps its
plain layers and pays nothing). Each part adds ``scale * (x @ a) @ b`` in the
order the request named the adapters; with one part the arithmetic is exactly
mlx-lm's ``LoRALinear`` / ``LoRASwitchLinear`` (eval mode), so greedy output
matches ``mlx_lm.load(path, adapter_path=...)`` token for token.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear


class LoRAStackLinear(nn.Module):
    def __init__(self, linear: nn.Module, parts: list):
        super().__init__()
        self.linear = linear
        self.parts = parts  # [(a (in, r), b (r, out), scale)]

    def __call__(self, x):
        y = self.linear(x)
        for a, b, scale in self.parts:
            z = (x @ a) @ b
            y = y + (scale * z).astype(x.dtype)
        return y


class LoRAStackSwitch(nn.Module):
    def __init__(self, linear: nn.Module, parts: list):
        super().__init__()
        self.linear = linear
        self.parts = parts  # [(a (E, r, in), b (E, out, r), scale)]

    def __call__(self, x, indices, sorted_indices=False):
        y = self.linear(x, indices, sorted_indices=sorted_indices)
        for a, b, scale in self.parts:
            z = mx.gather_mm(x, a.swapaxes(-1, -2), rhs_indices=indices,
                             sorted_indices=sorted_indices)
            z = mx.gather_mm(z, b.swapaxes(-1, -2), rhs_indices=indices,
                             sorted_indices=sorted_indices)
            y = y + (scale * z).astype(x.dtype)
        return y


WRAPPERS = (LoRAStackLinear, LoRAStackSwitch)


def wrap(base: nn.Module, parts: list) -> nn.Module:
    if isinstance(base, (SwitchLinear, QuantizedSwitchLinear)):
        return LoRAStackSwitch(base, parts)
    return LoRAStackLinear(base, parts)


def expected_shapes(module: nn.Module, rank: int):
    """``(a shape, b shape)`` a LoRA of ``rank`` must have on ``module``, or None when
    the module type cannot carry one."""
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        out_dims, in_dims = module.weight.shape
        if isinstance(module, nn.QuantizedLinear):
            in_dims = in_dims * 32 // module.bits
        return (in_dims, rank), (rank, out_dims)
    if isinstance(module, (SwitchLinear, QuantizedSwitchLinear)):
        return ((module.num_experts, rank, module.input_dims),
                (module.num_experts, module.output_dims, rank))
    return None


def rank_of(a) -> int:
    """The LoRA rank from the ``a`` factor (Linear ``(in, r)``, Switch ``(E, r, in)``)."""
    return a.shape[-1] if a.ndim == 2 else a.shape[-2]


def _walk(root, path: str):
    obj = root
    for name in path.split(".") if path else ():
        if isinstance(obj, (list, tuple)):
            if not name.isdigit() or int(name) >= len(obj):
                return None
            obj = obj[int(name)]
        elif isinstance(obj, dict) and name in obj:
            obj = obj[name]
        else:
            return None
    return obj


def get_module(root, path: str):
    """The module at a dotted ``path`` (``model.layers.3.self_attn.q_proj``), or None."""
    obj = _walk(root, path)
    return obj if isinstance(obj, nn.Module) else None


def set_module(root, path: str, module) -> None:
    """Put ``module`` at ``path`` (mlx-lm's model code stays as it is: only its tree)."""
    parent_path, _, name = path.rpartition(".")
    parent = _walk(root, parent_path)
    if isinstance(parent, list):
        parent[int(name)] = module
    else:
        parent[name] = module
