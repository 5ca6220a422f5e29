"""HLG tone-curve sampling: a monotone curve on each token's log-probability, drawn from.

Temperature is one straight line through the origin of the log-prob axis; the HLG curve
bends it in three regions around a pivot ``μ = max(ℓ) − pivot_offset``: a linear mid of
half-width ``width`` with slope ``m = 1/T`` (the request's temperature folds in there), a
logarithmic shoulder (scale ``shoulder``) that compresses the most likely tokens towards
their neighbours, and a logarithmic toe (scale ``toe``) that fades the tail softly instead
of clipping it. The curve is monotone, so it never reorders tokens: greedy decoding and
the argmax are untouched, and with the rolloff off it is temperature exactly.

A drawn curve (``points``, the /curves page's transfer curve) is the other shape: a
piecewise-linear map from log-prob to the logit drawn from, replacing temperature
entirely. It must be monotone (x increasing, y never decreasing), else a 400.

Either shape is a replacement *sampler* (top-p / top-k / min-p are not applied on top:
the toe is their replacement), built once per distinct setting and cached, so batch rows
with equal settings draw in one call and the reported log-probs stay the model's own.
Every step is whole-vocabulary MLX ops: no per-token Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import mlx.core as mx

from ..contract import Sampler
from ..errors import BadRequest

KNOB_MAX = 100.0  # nats: the spec's range for width / shoulder / toe / pivot_offset
DEFAULTS = {"width": 4.0, "shoulder": 4.0, "toe": 6.0, "pivot_offset": 6.0}
MAX_POINTS = 64  # a drawn curve's points (each is one O(V) ramp per sampled token)
X_RANGE = (-100.0, 0.0)  # a log-probability is never above 0
Y_LIMIT = 1e5  # a steep drawn curve is argmax in all but name
_KEYS = {"enabled", "pivot", "points", *DEFAULTS}


@dataclass(frozen=True)
class ToneCurve:
    """One request's curve: the HLG knobs, or a drawn transfer curve when ``points``."""

    width: float = DEFAULTS["width"]
    shoulder: float = DEFAULTS["shoulder"]
    toe: float = DEFAULTS["toe"]
    pivot_offset: float = DEFAULTS["pivot_offset"]
    points: tuple[tuple[float, float], ...] = ()

    def sampler(self, temperature: float) -> Sampler | None:
        """The sampler this curve replaces the temperature sampler with; None under greedy
        decoding (temperature 0), which a monotone HLG curve cannot change."""
        if self.points:
            return _points_sampler(self.points)
        if temperature <= 0:
            return None
        return _hlg_sampler(self.width, self.shoulder, self.toe, self.pivot_offset,
                            1.0 / temperature)

    def describe(self) -> dict[str, Any]:
        if self.points:
            return {"enabled": True, "points": [list(p) for p in self.points]}
        return {"enabled": True, "width": self.width, "shoulder": self.shoulder,
                "toe": self.toe, "pivot_offset": self.pivot_offset, "pivot": "top"}


# -- parsing ------------------------------------------------------------------------
def parse_hlg(value: object, default: dict[str, Any] | None = None,
              name: str = "hlg") -> ToneCurve | None:
    """The request's ``hlg`` object merged over the server's ``--hlg-sampling`` defaults;
    None when HLG is off. Any bad shape is a 400 naming the field."""
    if value is not None and not isinstance(value, dict):
        raise BadRequest(f"{name} must be an object", param=name)
    merged: dict[str, Any] = {**(default or {}), **(value or {})}
    unknown = sorted(set(value or {}) - _KEYS)
    if unknown:
        raise BadRequest(f"{name}.{unknown[0]} is not a known field (known: "
                         f"{', '.join(sorted(_KEYS))})", param=f"{name}.{unknown[0]}")
    enabled = merged.get("enabled", value is not None)
    if not isinstance(enabled, bool):
        raise BadRequest(f"{name}.enabled must be a boolean", param=f"{name}.enabled")
    if merged.get("pivot", "top") != "top":
        raise BadRequest(f"{name}.pivot must be 'top' (the only pivot mode)",
                         param=f"{name}.pivot")
    knobs = {k: _knob(merged.get(k), k, name) for k in DEFAULTS}
    points = parse_points(merged["points"], f"{name}.points") \
        if merged.get("points") is not None else ()
    return ToneCurve(points=points, **knobs) if enabled else None


def _knob(value: object, key: str, name: str) -> float:
    if value is None:
        return DEFAULTS[key]
    number = _number(value)
    if number is None or not 0 <= number <= KNOB_MAX:
        raise BadRequest(f"{name}.{key} must be a number of nats from 0 to {KNOB_MAX:g}",
                         param=f"{name}.{key}")
    return number


def _number(value: object) -> float | None:
    """``value`` as a finite float; None when it is not a JSON number (or not finite)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value):
        return float(value)
    return None


def parse_points(value: object, name: str = "curve.points") -> tuple[tuple[float, float], ...]:
    """A drawn transfer curve: 2..64 points ``[x, y]`` or ``{"x", "y"}``, x a log-prob
    (-100..0) strictly increasing, y never decreasing (a monotone curve). 400 otherwise."""
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_POINTS:
        raise BadRequest(f"{name} must be an array of 2 to {MAX_POINTS} points", param=name)
    out: list[tuple[float, float]] = []
    for i, p in enumerate(value):
        x, y = (p.get("x"), p.get("y")) if isinstance(p, dict) else \
            (p[0], p[1]) if isinstance(p, list) and len(p) == 2 else (None, None)
        fx, fy = _number(x), _number(y)
        if fx is None or fy is None:
            raise BadRequest(f"{name}[{i}] must be a point [x, y] or {{x, y}} of numbers",
                             param=name)
        if not X_RANGE[0] <= fx <= X_RANGE[1] or abs(fy) > Y_LIMIT:
            raise BadRequest(f"{name}[{i}] is out of range (x a log-prob from -100 to 0, "
                             f"|y| at most {Y_LIMIT:g})", param=name)
        if out and (fx <= out[-1][0] or fy < out[-1][1]):
            raise BadRequest(f"{name} is not monotone at point {i}: x must increase and y "
                             f"never decrease", param=name, code="non_monotone_curve")
        out.append((fx, fy))
    return tuple(out)


# -- the curves ------------------------------------------------------------------------
def tone_map(logprobs: mx.array, width: float, shoulder: float, toe: float,
             pivot_offset: float, gain: float) -> mx.array:
    """The HLG curve applied to each row's log-probs (``[..., V]``), branchless; masked
    (-inf) tokens stay masked."""
    z = logprobs - (mx.max(logprobs, axis=-1, keepdims=True) - pivot_offset)
    mid = gain * z
    high = gain * width + _rolloff(z - width, shoulder, gain)
    low = -gain * width - _rolloff(-z - width, toe, gain)
    out = mx.where(z > width, high, mx.where(z < -width, low, mid))
    return mx.where(mx.isneginf(logprobs), -mx.inf, out)


def _rolloff(d: mx.array, scale: float, gain: float) -> mx.array:
    """``m·β·ln(1 + d/β)``: slope ``m`` at the knot, decaying as ``m·β/(β + d)``; flat at
    ``β = 0`` (its limit)."""
    if scale <= 0:
        return mx.zeros_like(d)
    return (gain * scale) * mx.log1p(mx.maximum(d, 0.0) / scale)


def transfer_map(logprobs: mx.array, points: tuple[tuple[float, float], ...]) -> mx.array:
    """The drawn curve: piecewise-linear through ``points``, slope 1 beyond either end, as
    a sum of clipped ramps (one whole-vocabulary op per segment), in float32."""
    logprobs = logprobs.astype(mx.float32)
    (x0, y0), (xn, _) = points[0], points[-1]
    out = y0 + mx.minimum(logprobs - x0, 0.0) + mx.maximum(logprobs - xn, 0.0)
    for (xa, ya), (xb, yb) in zip(points, points[1:], strict=False):
        out = out + ((yb - ya) / (xb - xa)) * mx.clip(logprobs - xa, 0.0, xb - xa)
    return mx.where(mx.isneginf(logprobs), -mx.inf, out)


@lru_cache(maxsize=256)
def _hlg_sampler(width: float, shoulder: float, toe: float, pivot_offset: float,
                 gain: float) -> Sampler:
    def sample(logprobs: mx.array) -> mx.array:
        return mx.random.categorical(tone_map(logprobs, width, shoulder, toe, pivot_offset,
                                              gain))
    return sample


@lru_cache(maxsize=256)
def _points_sampler(points: tuple[tuple[float, float], ...]) -> Sampler:
    def sample(logprobs: mx.array) -> mx.array:
        return mx.random.categorical(transfer_map(logprobs, points))
    return sample


def server_default(args: Any) -> dict[str, Any] | None:
    """``--hlg-sampling on`` and its knobs as the ``hlg`` default every request merges
    over; None when off."""
    if getattr(args, "hlg_sampling", "off") != "on":
        return None
    return {"enabled": True, "width": args.hlg_width, "shoulder": args.hlg_shoulder,
            "toe": args.hlg_toe, "pivot_offset": args.hlg_pivot_offset}
