"""Quantized linear layers that dequantize when many rows go through them at once.

A quantized matmul reads the packed weights once and unpacks them on the fly, which is
what a decode step of one row wants: the step is a read of the weights. With many rows
(a wide decode batch, a prefill chunk) the same matmul should cost about the same, but
MLX's CUDA backend runs it as one matrix-vector product per row, so 32 rows of 4-bit
8B decode at a sixth of bf16's speed (``bench/NOTES.md``). :class:`WideQuantizedLinear`
keeps the packed weights (the memory saving stays) and, for an input of ``min_rows``
rows or more, unpacks the layer's weights into a temporary and multiplies densely: a
read of the packed weights, a write and a read of the dense ones, whatever the row
count. Fewer rows take the quantized matmul as before.

The swap goes through MLX's public module API (``update_modules``) and keeps the
``nn.QuantizedLinear`` type, so adapters that wrap quantized layers still recognise
them; layers of other kinds (sharded, mixture-of-experts, embeddings) are left alone.
Whether a device gains is measured, not assumed: on an H100, 8B 4-bit, the batch's decode
went from 197 to 235 tok/s at 8 rows and from 266 to 668 at 32 (mlx-lm's
``BatchGenerator``: 254 and 304; ``bench/batch_step.py --unpack``, ``bench/NOTES.md``).
The default turns it on for CUDA only, from :data:`CUDA_MIN_ROWS` rows.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

CUDA_MIN_ROWS = 8  # rows from which CUDA dequantizes (bench/results/quant_matmul_h100.json)


class WideQuantizedLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` that multiplies densely for inputs of ``min_rows`` rows
    or more (see the module's docstring)."""

    def __init__(self, base: nn.QuantizedLinear, min_rows: int):
        nn.Module.__init__(self)
        self.group_size, self.bits, self.mode = base.group_size, base.bits, base.mode
        self.min_rows = min_rows
        for name, value in base.items():  # weight, scales, biases, bias: shared, not copied
            self[name] = value
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        if x.size < self.min_rows * x.shape[-1]:
            return quantized(self, x)
        w = mx.dequantize(self["weight"], self["scales"], self.get("biases"),
                          group_size=self.group_size, bits=self.bits, mode=self.mode,
                          dtype=x.dtype)
        y = x @ w.T
        return y + self["bias"] if "bias" in self else y


def quantized(layer: nn.QuantizedLinear | nn.QuantizedEmbedding, x: mx.array) -> mx.array:
    """``layer`` over ``x`` by the quantized matmul (``nn.QuantizedLinear``'s own way)."""
    y = mx.quantized_matmul(x, layer["weight"], scales=layer["scales"],
                            biases=layer.get("biases"), transpose=True,
                            group_size=layer.group_size, bits=layer.bits, mode=layer.mode)
    return y + layer["bias"] if "bias" in layer else y


def install(model: nn.Module, min_rows: int) -> int:
    """Swap every plain ``nn.QuantizedLinear`` of ``model`` for a wide one (rows from
    ``min_rows``); returns how many were swapped (0: nothing quantized, or done)."""
    swaps = [(name, WideQuantizedLinear(m, min_rows)) for name, m in model.named_modules()
             if type(m) is nn.QuantizedLinear]
    if swaps:
        model.update_modules(tree_unflatten(swaps))
    return len(swaps)


WARM_ROWS = (2, 4, 8, 16, 32, 64)
"""Row counts the quantized matmul is run at before the first request: MLX's CUDA build
picks a kernel by the row count (one matrix-vector product per row below 8 rows, a tiled
kernel from 8) and compiles the tiled one at its first use."""


def warm_matmuls(model: nn.Module, rows: tuple[int, ...] = WARM_ROWS) -> int:
    """Run each kind of quantized matmul ``model`` holds (plain, wide and embedding layers
    used as the output projection; one layer per bits, group size, mode and shape) at
    ``rows`` rows, so no request pays for a kernel's first use: with 4-bit weights on an
    H100 the first 32-client load waited 44 s while MLX compiled its tiled quantized
    matmul for the tied output projection, which no pass of the warm-up had reached
    (``bench/first_use_kernels.py``). Returns how many matmuls ran."""
    kinds: dict[tuple[object, ...], nn.QuantizedLinear | nn.QuantizedEmbedding] = {}
    for _, m in model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            w = m["weight"]
            kinds.setdefault((m.bits, m.group_size, m.mode, tuple(w.shape)), m)
    outs = []
    for m in kinds.values():
        dims = m["weight"].shape[-1] * 32 // m.bits
        for n in rows:
            x = mx.zeros((n, dims), dtype=m["scales"].dtype)
            outs.append(quantized(m, x))
    mx.eval(outs)
    return len(outs)


EXPERTS_PER_ROW = 8  # experts a row is routed to while warming (a common top-k)


def warm_experts(model: nn.Module, rows: tuple[int, ...] = WARM_ROWS) -> int:
    """The mixture-of-experts counterpart of :func:`warm_matmuls`: each kind of expert
    block whose experts are quantized (mlx-lm's ``SwitchGLU`` and ``SwitchMLP``; one per
    bits, group size, mode and shape) runs at ``rows`` rows, each routed to several
    experts, so the gathered quantized matmuls a decode batch reaches (sorted from 64
    rows-times-experts, as the block sorts them; unsorted below) are compiled before the
    first request. Returns how many blocks ran."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU, SwitchMLP

    kinds: dict[tuple[object, ...], tuple[nn.Module, QuantizedSwitchLinear]] = {}
    for _, m in model.named_modules():
        if isinstance(m, (SwitchGLU, SwitchMLP)):
            proj = m.gate_proj if isinstance(m, SwitchGLU) else m.fc1
            if isinstance(proj, QuantizedSwitchLinear):
                key = (proj.bits, proj.group_size, getattr(proj, "mode", "affine"),
                       tuple(proj["weight"].shape))
                kinds.setdefault(key, (m, proj))
    outs = []
    for block, first in kinds.values():
        experts, _, packed = first["weight"].shape
        dims, k = packed * 32 // first.bits, min(EXPERTS_PER_ROW, experts)
        for n in rows:
            x = mx.zeros((n, dims), dtype=first["scales"].dtype)
            chosen = (mx.arange(n * k, dtype=mx.uint32) % experts).reshape(n, k)
            outs.append(block(x, chosen))
    mx.eval(outs)
    return len(outs)


def widest_bytes(model: nn.Module, dtype_size: int = 2) -> int:
    """The largest dense weight one wide layer unpacks (bytes at ``dtype_size``): what
    a wide pass holds beside its activations, one layer at a time."""
    best = 0
    for _, m in model.named_modules():
        if isinstance(m, WideQuantizedLinear):
            rows, packed = m["weight"].shape[-2:]
            best = max(best, rows * packed * 32 // m.bits * dtype_size)
    return best


def min_rows(backend: str, setting: str = "auto") -> int:
    """The row count from which to dequantize on ``backend`` (0: never), by the
    ``engine.unpack_quantized`` switch: auto (CUDA only), on, off."""
    if setting == "off" or (setting == "auto" and backend != "cuda"):
        return 0
    return CUDA_MIN_ROWS
