"""Per-row LoRA: rows of one batch run different adapter sets (the S-LoRA / punica way).

Every LoRA'd linear keeps its base matmul for the whole batch and adds each row's
low-rank delta by gathering that row's factors. The adapters in use are stacked per
layer, output-major like a weight, into ``a (S, r, in)`` and ``b (S, out, r)``: slot 0 is
all zeros ("no adapter"), ranks are padded to the layer's largest with zeros, and an
adapter that does not touch a layer holds zeros there. A forward pass routes its rows
with one ``(rows,)`` slot array per stacked position (a request may stack ``a+b``):
the row's ``(x @ a) @ b`` times the slot's scale, added in the order the request named
its adapters. Per row that is mlx-lm's ``LoRALinear`` arithmetic (zero padding adds
exact zeros), so a row's greedy output equals the same request run alone.

How the rows' factors are read: a decode pass (one token a row) uses ``mx.gather_mm``
on the transposed stacks, the call mlx-lm's expert layers make (a gathered mat-vec on
CUDA, whose ``gather_mm`` supports only that shape); a prefill chunk takes the rows'
factors (``mx.take``, rows x r x in, small) and runs one batched matmul.

Expert (switch) layers route tokens after sorting them by expert, which loses the row;
sets with expert LoRA layers therefore never mix (they keep one set per batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

if TYPE_CHECKING:
    from .sets import AdapterSet, Mounted


class RowRoute:
    """The routing of the next forward pass, shared by every row-LoRA layer: per stacked
    position, the rows' slot array and, per distinct scale vector, the rows' scales
    shaped ``(rows, 1, 1)``."""

    def __init__(self) -> None:
        self.rows = 0
        self.columns: list[tuple[mx.array, list[mx.array]]] = []


class LoRARowsLinear(nn.Module):
    """A ``Linear`` / ``QuantizedLinear`` plus each row's gathered LoRA delta."""

    def __init__(self, linear: nn.Module, a: mx.array, b: mx.array, vector: int,
                 route: RowRoute):
        super().__init__()
        self.linear = linear
        self.stack = (a, b)  # (S, r, in), (S, out, r)
        self.vector = vector  # which of the route's scale vectors this layer uses
        self.route = route

    def __call__(self, x: mx.array) -> mx.array:
        y = self.linear(x)
        a, b = self.stack
        n = self.route.rows  # the pass's rows lead x, whatever the model did with the rest
        rows = x if x.ndim == 3 and x.shape[0] == n else x.reshape(n, -1, x.shape[-1])
        for idx, scales in self.route.columns:
            if rows.shape[1] == 1:  # decode: gathered mat-vecs
                z = mx.gather_mm(rows, a.swapaxes(-1, -2), rhs_indices=idx)
                z = mx.gather_mm(z, b.swapaxes(-1, -2), rhs_indices=idx)
            else:  # prefill: the rows' own factors, one batched matmul each
                z = rows @ mx.take(a, idx, axis=0).swapaxes(-1, -2)
                z = z @ mx.take(b, idx, axis=0).swapaxes(-1, -2)
            scale = scales[self.vector]
            if scale.dtype != z.dtype:  # mlx-lm multiplies by a weak Python float
                scale = scale.astype(z.dtype)
            z = scale * z
            y = y + (z if rows is x else z.reshape(*x.shape[:-1], -1)).astype(x.dtype)
        return y


class Roster:
    """The adapters stacked for per-row routing: one slot each (slot 0: none), the
    stacked factors per layer path, and the distinct per-slot scale vectors."""

    def __init__(self, adapters: Sequence[Mounted]):
        self.adapters = tuple(adapters)
        self.slot = {a: i + 1 for i, a in enumerate(self.adapters)}
        vectors: dict[tuple[float, ...], int] = {}
        self.layers: dict[str, tuple[mx.array, mx.array, int]] = {}
        for path in sorted({p for a in self.adapters for p in a.parts}):
            a, b, scales = _stack(path, self.adapters)
            self.layers[path] = (a, b, vectors.setdefault(scales, len(vectors)))
        self.vectors = [mx.array(v, dtype=mx.float32) for v in vectors]
        mx.eval([t for a, b, _ in self.layers.values() for t in (a, b)], self.vectors)
        self.nbytes = sum(a.nbytes + b.nbytes for a, b, _ in self.layers.values())
        self._modules: dict | None = None
        self._fills: dict[tuple, tuple[int, list]] = {}  # recent routings, by row set keys

    def covers(self, adapters: set) -> bool:
        return adapters <= self.slot.keys()

    def modules(self, base_module: Callable[[str], Any], route: RowRoute) -> dict:
        """The row-LoRA wrappers over the plain layers, by path (made once)."""
        if self._modules is None:
            self._modules = {path: LoRARowsLinear(base_module(path), a, b, vec, route)
                             for path, (a, b, vec) in self.layers.items()}
        return self._modules

    def fill(self, route: RowRoute, sets: Sequence[AdapterSet], keys: tuple) -> None:
        """Point ``route`` at ``sets`` (one per row, in the pass's row order; ``keys``
        their keys). Nothing is evaluated here: the arrays join the pass's graph."""
        got = self._fills.get(keys)
        if got is None:
            columns = []
            for j in range(max(len(s.adapters) for s in sets)):
                slots = [self.slot[s.adapters[j]] if j < len(s.adapters) else 0 for s in sets]
                idx = mx.array(slots, dtype=mx.uint32)
                columns.append((idx, [mx.take(v, idx).reshape(-1, 1, 1) for v in self.vectors]))
            if len(self._fills) >= 8:  # a prefill pass and a decode pass alternate: keep a few
                self._fills.pop(next(iter(self._fills)))
            got = self._fills[keys] = (len(sets), columns)
        route.rows, route.columns = got


def _stack(path: str, adapters: Sequence[Mounted]) -> tuple[mx.array, mx.array,
                                                             tuple[float, ...]]:
    """One layer's ``(a (S, r, in), b (S, out, r), per-slot scales)``."""
    pieces = [m.parts.get(path) for m in adapters]
    present = [p for p in pieces if p is not None]
    rank = max(p[0].shape[1] for p in present)
    in_dims, out_dims = present[0][0].shape[0], present[0][1].shape[1]
    dtypes = {t.dtype for a, b, _ in present for t in (a, b)}
    dtype = dtypes.pop() if len(dtypes) == 1 else mx.float32  # mixed dtypes: the widest
    a_slots, b_slots = [mx.zeros((rank, in_dims), dtype)], [mx.zeros((out_dims, rank), dtype)]
    scales = [0.0]
    for piece in pieces:
        if piece is None:
            a_slots.append(a_slots[0])
            b_slots.append(b_slots[0])
            scales.append(0.0)
            continue
        a, b, scale = piece
        a, b = a.T, b.T  # (r, in), (out, r)
        pad = rank - a.shape[0]
        if pad:
            a = mx.concatenate([a, mx.zeros((pad, in_dims), a.dtype)], axis=0)
            b = mx.concatenate([b, mx.zeros((out_dims, pad), b.dtype)], axis=1)
        a_slots.append(a.astype(dtype))
        b_slots.append(b.astype(dtype))
        scales.append(float(scale))
    return mx.stack(a_slots), mx.stack(b_slots), tuple(scales)
