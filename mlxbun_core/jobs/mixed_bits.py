"""Mixed precision to a size: per-layer bits chosen so the model lands at a target bits
per weight (``convert --target-bpw``, the quantize job's ``target_bpw``).

Each quantizable layer gets a sensitivity: with calibration text, mlx-lm's own estimate
(``mlx_lm.quant.dynamic_quant.estimate_sensitivities``: the KL gradient's alignment with
the low-to-high quantization change); without it, a data-free one (the mean squared
difference between the layer quantized at the low and at the high bits). Layers are then
raised to the high bits most sensitive first while the whole model stays at or under the
target, counting bits as ``mlx_lm.utils.compute_bits_per_weight`` does (packed weights,
16-bit scales and biases per group, everything else at its dtype). The result is a
``quant_predicate`` for mlx-lm's ``quantize_model`` / ``convert``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

CALIBRATION_SEQUENCE = 512


@dataclass(frozen=True)
class Plan:
    """Which layers get the high bits, and the bits per weight that makes."""

    high: frozenset[str]
    bpw: float
    low_bits: int
    high_bits: int
    group_size: int
    reachable: tuple[float, float]  # all layers low, all layers high

    def predicate(self) -> Callable[[str, Any], bool | dict]:
        def choose(path: str, module: Any) -> bool | dict:
            if path in self.high:
                return {"bits": self.high_bits, "group_size": self.group_size}
            return True  # the low bits, quantize_model's defaults

        return choose


def quantizable(model: nn.Module, group_size: int) -> dict[str, nn.Module]:
    """The layers ``quantize_model`` would quantize (a weight whose rows split into groups)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    leaves = cast("list[tuple[str, nn.Module]]",
                  tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    return {k: m for k, m in leaves if hasattr(m, "to_quantized")
            and m.weight.shape[-1] % group_size == 0}


def data_free_sensitivities(layers: dict[str, nn.Module], low: int, high: int,
                            group_size: int) -> dict[str, float]:
    import mlx.core as mx

    def qdq(w: mx.array, bits: int) -> mx.array:
        q, s, b = mx.quantize(w, bits=bits, group_size=group_size)
        return mx.dequantize(q, s, b, bits=bits, group_size=group_size)

    out = {}
    for path, layer in layers.items():
        w = layer.weight.astype(mx.float32)
        diff = mx.mean(mx.square(qdq(w, low) - qdq(w, high))).astype(mx.float32)
        out[path] = float(cast("float", diff.item()))
    return out


def calibration_tokens(tokenizer: Any, path: Path, samples: int) -> mx.array:
    """Up to ``samples`` rows of tokens from a local ``.jsonl`` (``text`` rows) or text file,
    as mlx-lm's ``load_data`` cuts its calibration text (consecutive equal-length rows)."""
    import json

    import mlx.core as mx

    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        raw = "\n\n".join(str(json.loads(line).get("text", "")) for line in raw.splitlines()
                          if line.strip())
    tokens = tokenizer.encode(raw)
    length = min(CALIBRATION_SEQUENCE, len(tokens) // max(1, samples))
    if length < 8:
        raise ValueError(f"{path}: {len(tokens)} tokens are too few for {samples} "
                         "calibration rows (8 tokens a row at least)")
    rows = min(samples, len(tokens) // length)
    return mx.array(tokens[:rows * length]).reshape(rows, length)


def _bits(array: mx.array) -> int:
    return array.nbytes * 8


def plan(model: nn.Module, target_bpw: float, sensitivities: dict[str, float],
         low: int, high: int, group_size: int) -> Plan:
    """The most sensitive layers at ``high`` bits, as many as keep the model at or under
    ``target_bpw``. ValueError when the target is outside what low..high reaches."""
    from mlx.utils import tree_flatten

    layers = quantizable(model, group_size)
    params = dict(tree_flatten(model.parameters()))
    weights = {f"{p}.weight" for p in layers}
    fixed = sum(_bits(v) for k, v in params.items() if k not in weights)
    total = sum(v.size for v in params.values())
    per_weight = {p: m.weight.size for p, m in layers.items()}

    def cost(bits: int, n: int) -> float:
        return n * (bits + 32 / group_size)

    low_total = fixed + sum(cost(low, n) for n in per_weight.values())
    reachable = (low_total / total,
                 (fixed + sum(cost(high, n) for n in per_weight.values())) / total)
    if not reachable[0] <= target_bpw <= reachable[1] + 1e-9:
        raise ValueError(f"target_bpw {target_bpw} is outside what {low}- and {high}-bit "
                         f"layers reach here: {reachable[0]:.3f} to {reachable[1]:.3f}")
    chosen, bits_now = set(), low_total
    for path in sorted(layers, key=lambda p: -sensitivities.get(p, 0.0)):
        extra = cost(high, per_weight[path]) - cost(low, per_weight[path])
        if (bits_now + extra) / total <= target_bpw:
            chosen.add(path)
            bits_now += extra
    return Plan(frozenset(chosen), bits_now / total, low, high, group_size, reachable)


def target_plan(model_dir: Path, target_bpw: float, *, bits: tuple[int, int] = (4, 8),
                group_size: int = 64, calibration: Path | None = None,
                samples: int = 32) -> Plan:
    """Load ``model_dir`` and plan its mixed bits (calibrated when ``calibration`` is given)."""
    from mlx_lm.utils import load

    low, high = bits
    if not low < high:
        raise ValueError(f"candidate bits must be two, low then high: got {low},{high}")
    model, tokenizer = cast("tuple[Any, Any]", load(str(model_dir), lazy=calibration is None))
    if calibration is None:
        sens = data_free_sensitivities(quantizable(model, group_size), low, high, group_size)
    else:
        from mlx_lm.quant.dynamic_quant import estimate_sensitivities

        data = calibration_tokens(tokenizer, calibration, samples)
        sens = dict(estimate_sensitivities(model, data, low, group_size, high, group_size,
                                           batch_size=min(4, data.shape[0])))
    return plan(model, target_bpw, sens, low, high, group_size)
