"""A model's context window, and the RoPE scaling that stretches it (``--context-length``).

A checkpoint states the window it was trained for (``max_position_embeddings``). Asking for
less simply caps what is served. Asking for more rewrites the config's ``rope_scaling``
before mlx-lm builds the model (``load(..., model_config=...)``; mlx-lm's own
``rope_utils.initialize_rope`` then builds the scaled rotary embedding), so nothing of
mlx-lm is patched:

- a config without scaling gets YaRN (``factor`` = asked / native over the native
  window) without its attention temperature (``mscale`` 0): rotary frequencies that turn
  more than 32 times within the trained window stay as trained, those that turn less than
  once are divided by the factor, the ones between are blended. YaRN's temperature (0.1 ln
  s + 1 on queries and keys) turned SmolLM2-135M's "The capital of France is Paris." into
  French noise; without it the answer is word for word the native one, and on a long text
  it predicted better than mlx-lm's ``llama3`` scaling at every range (bench/NOTES.md).
  Where an architecture's code ignores YaRN, ``llama3``, then linear interpolation, are
  tried;
- a config that already scales with ``yarn``, ``linear`` or ``llama3`` keeps its kind and
  multiplies its ``factor``.

Whether the architecture honours the result is not guessed from its name: mlx-lm's model
class is built twice from the config, lazily (no weight is read or allocated), with and
without the new scaling, and its rotary modules are compared. No rotary module at all
(a recurrent or learned-position model), only sliding-window caches (positions past the
window are never attended), or identical modules (the code ignores ``rope_scaling``) is
refused with the reason, before the weights load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SCALED_KINDS = ("yarn", "linear", "llama3")  # mlx-lm rope types whose factor stretches
FRESH_KINDS = ("yarn", "llama3", "linear")  # tried in this order on a config with no scaling
KIND_NAMES = {"yarn": "YaRN", "linear": "linear", "llama3": "llama3"}
PROBE_AT = 4096  # the position a rotary module is probed at (any change of angle shows there)


class WindowUnsupported(Exception):
    """The model's window cannot be stretched; ``str()`` says why, for the operator."""


@dataclass(frozen=True)
class WindowPlan:
    """What ``--context-length`` does to one checkpoint."""

    native: int  # the window the checkpoint was trained for
    window: int  # the window served
    rope: dict[str, Any] | None = None  # the rope_scaling written (None: a cap, no rewrite)
    overrides: dict[str, Any] = field(default_factory=dict)  # mlx-lm load(model_config=...)

    @property
    def extended(self) -> bool:
        return self.rope is not None

    def config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint's config as the model is built (what ``fit`` should read)."""
        return {**config, **self.overrides}

    def report(self) -> dict[str, Any]:
        """What ``LoadedModel.extras["window"]`` holds: ``/v1/models`` and the banner."""
        return {"window": self.window, "native": self.native,
                "rope_scaling": dict(self.rope) if self.rope else None}


def note(report: dict[str, Any] | None) -> str:
    """`` (8192 native, YaRN x4)`` after a served window (empty: the trained one)."""
    if not report:
        return ""
    rope = report.get("rope_scaling")
    if not rope:
        return f" (capped; {report['native']} native)"
    kind = rope_kind(rope)
    stretch = report["window"] / report["native"]
    text = f"{stretch:g}" if abs(stretch - round(stretch)) < 1e-9 else f"{stretch:.2f}"
    return f" ({report['native']} native, {KIND_NAMES.get(kind, kind)} x{text})"


def native_window(config: dict[str, Any]) -> int | None:
    """The window the config states (``text_config`` first, as a multimodal checkpoint
    nests it), or None."""
    inner = config.get("text_config")
    for c in (inner if isinstance(inner, dict) else {}, config):
        v = c.get("max_position_embeddings")
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def rope_kind(scaling: dict[str, Any] | None) -> str:
    if not isinstance(scaling, dict):
        return "default"
    return str(scaling.get("type") or scaling.get("rope_type") or "default")


def plan_window(config: dict[str, Any], asked: int | None, *,
                check_arch: bool = True) -> WindowPlan | None:
    """What serving ``config`` with a window of ``asked`` tokens takes (None: nothing
    asked). Raises :class:`WindowUnsupported` with the reason when it cannot be done.
    ``check_arch``: build mlx-lm's model class to see that it honours the scaling."""
    if asked is None:
        return None
    native = native_window(config)
    if native is None:
        raise WindowUnsupported("its config states no trained window (max_position_embeddings), "
                                "so there is nothing to cap or stretch")
    if asked <= native:
        return WindowPlan(native, asked)
    holder, nested = _holder(config)
    tried = []
    for kind, key in _candidates(holder):
        rope = _scaled(holder, kind, asked / native, native, key)
        keys = {key: rope, "max_position_embeddings": asked}
        overrides = {"text_config": {**holder, **keys}} if nested else keys
        plan = WindowPlan(native, asked, rope, overrides)
        if not check_arch:
            return plan
        why = arch_refusal(config, plan.config(config), f"{key} {kind!r}")
        if why is None:
            return plan
        tried.append(why)
    raise WindowUnsupported(_summary(tried))


def _summary(refusals: list[str]) -> str:
    """One sentence for every candidate refused: the "code ignores" ones merged
    (``... code ignores rope_scaling (tried 'llama3', 'yarn', 'linear'): ...``)."""
    ignored: dict[tuple[str, str], list[str]] = {}
    rest = []
    for r in refusals:
        head, sep, tail = r.partition(" code ignores ")
        if not sep:
            rest.append(r)
            continue
        key, _, kind = tail.split(":", 1)[0].partition(" ")
        ignored.setdefault((head, key), []).append(kind)
    said = [f"{head} code ignores {key} (tried {', '.join(kinds)}): its rotary embedding "
            "stays as trained" for (head, key), kinds in ignored.items()]
    return "; ".join(dict.fromkeys(said + rest))


def _holder(config: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The dict that holds the window: ``text_config`` when the window is stated there."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and inner.get("max_position_embeddings"):
        return inner, True
    return config, False


def _existing(holder: dict[str, Any]) -> dict[str, Any] | None:
    """The scaling the config applies now: ``rope_scaling``, else a flat
    ``rope_parameters`` (transformers 5 nests it there) that is not the default."""
    scaling = holder.get("rope_scaling")
    if isinstance(scaling, dict) and rope_kind(scaling) != "default":
        return scaling
    params = holder.get("rope_parameters")
    if isinstance(params, dict) and "rope_type" in params and rope_kind(params) != "default":
        return params
    return None


def _candidates(holder: dict[str, Any]) -> list[tuple[str, str]]:
    """(rope kind, config key) pairs to try, best first. ``rope_parameters`` (the
    transformers 5 spelling, which some mlx-lm models read instead) is tried after
    ``rope_scaling`` when the config has it flat."""
    existing = _existing(holder)
    kinds: tuple[str, ...] = FRESH_KINDS
    if existing is not None:
        kind = rope_kind(existing)
        if kind not in SCALED_KINDS:
            raise WindowUnsupported(f"its config already scales RoPE with {kind!r}, which "
                                    "mlxbun cannot stretch further (it stretches yarn, linear "
                                    "and llama3)")
        kinds = (kind,)
    params = holder.get("rope_parameters")
    flat = isinstance(params, dict) and not any(isinstance(v, dict) for v in params.values())
    keys = ("rope_scaling", "rope_parameters") if flat else ("rope_scaling",)
    return [(kind, key) for key in keys for kind in kinds]


def _scaled(holder: dict[str, Any], kind: str, stretch: float, native: int,
            key: str = "rope_scaling") -> dict[str, Any]:
    """The scaling for ``kind`` that stretches the window by ``stretch``, as written
    under ``key`` (``rope_parameters`` keeps its other fields: theta, partial rotary)."""
    existing = _existing(holder)
    base = dict(holder.get(key) or {}) if key == "rope_parameters" else {}
    if existing is not None:  # the same kind, a bigger factor
        old = float(existing.get("factor", 1.0) or 1.0)
        rope = {**base, **existing, "factor": old * stretch}
        if key == "rope_scaling":
            rope.pop("rope_theta", None)
        if kind == "yarn" and "original_max_position_embeddings" not in rope:
            rope["original_max_position_embeddings"] = max(1, math.floor(native / old))
        return rope
    rope = {**base, "type": kind, "rope_type": kind, "factor": float(stretch)}
    if kind == "llama3":
        rope.update(low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=native)
    elif kind == "yarn":  # no attention temperature (mscale 0: a factor of 1 everywhere)
        rope.update(original_max_position_embeddings=native, mscale=0.0, mscale_all_dim=0.0)
    return rope


def arch_refusal(config: dict[str, Any], scaled: dict[str, Any], what: str) -> str | None:
    """Why mlx-lm's architecture for ``config`` would not honour the scaling in
    ``scaled`` (``what``: which, in words); None when it does. Builds the model class
    lazily, twice."""
    from .classes import model_classes
    model_type = str(config.get("model_type", "?"))
    try:
        model_class, args_class = model_classes(config)
        plain = model_class(args_class.from_dict(config))
    except Exception as exc:
        return f"mlx-lm cannot build {model_type!r} from its config ({exc})"
    before = _rotary(plain)
    if not before:
        return (f"mlx-lm's {model_type!r} has no rotary position embedding (a recurrent or "
                "learned-position model): there is nothing to stretch")
    if _sliding_only(plain):
        return (f"every attention layer of {model_type!r} is a sliding window: positions "
                "past it are never attended, so its window is not what limits a prompt")
    try:
        after = _rotary(model_class(args_class.from_dict(scaled)))
    except Exception as exc:
        return f"mlx-lm's {model_type!r} rejects {what} ({exc})"
    if after == before:
        return f"mlx-lm's {model_type!r} code ignores {what}: its rotary embedding stays as trained"
    return None


def _rotary(module: Any) -> list[tuple[str, str, tuple[float, ...]]]:
    """Every rotary module of ``module``: (path, class, what it makes of a probe). The
    probe is a vector of ones rotated at a far position, so any change to the angles
    (base, factor, per-frequency scaling) or to the magnitude (YaRN's mscale) shows,
    read through the module's public call only."""
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

    out = []
    for name, m in module.named_modules():
        cls = type(m).__name__
        if not (isinstance(m, nn.RoPE) or "rope" in cls.lower() or "rotary" in cls.lower()):
            continue
        out.append((name, cls, _probe(m, mx, np)))
    return out


def _probe(rope: Any, mx: Any, np: Any) -> tuple[float, ...]:
    """``rope`` applied to ones of its width at position ``PROBE_AT`` (empty when it
    states no width or does not take the call)."""
    dims = next((v for a in ("dims", "dim", "head_dim")
                 if isinstance(v := getattr(rope, a, None), int) and v > 0), None)
    if dims is None:
        return ()
    try:
        got = rope(mx.ones((1, 1, 1, dims), dtype=mx.float32), offset=PROBE_AT)
        return tuple(np.asarray(got.astype(mx.float32)).reshape(-1).round(6).tolist())
    except Exception:
        return ()


def _sliding_only(module: Any) -> bool:
    """Whether every cache the model makes is a sliding window (mlx-lm's
    ``RotatingKVCache``)."""
    make = getattr(module, "make_cache", None)
    if not callable(make):
        return False
    try:
        from mlx_lm.models.cache import RotatingKVCache

        caches = make()
    except Exception:
        return False
    return bool(caches) and all(isinstance(c, RotatingKVCache) for c in caches)
