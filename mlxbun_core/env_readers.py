"""How a set ``MLXBUN_*`` variable's text becomes a run-configuration value
(:mod:`mlxbun_core.runconfig`): the shared switches' parsers, one reader per field, the
variables another name may stand in for, and the spellings from before the rename.

Like the run configuration it serves, this sits on the records floor: it imports nothing
of ours."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mlxbun.config")

SWITCH_MODES = ("auto", "on", "off")
FILL_MODES = ("off", "strict")
DEFAULT_FILL_MAX_SPAN = 32
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_switch(value: str | None, var: str) -> str:
    """``auto``/``on``/``off`` (``1``/``true``/``yes`` on, ``0``/``false``/``no`` off)."""
    v = (value or "auto").strip().lower()
    v = "on" if v in _TRUE else "off" if v in _FALSE else v
    if v not in SWITCH_MODES:
        raise ValueError(f"{var} must be auto, on or off, not {value!r}")
    return v


ECHO_REFUSED = ("MLXBUN_FILL=echo is refused: this engine has no echo index (spans copied "
                "from earlier in the session, verified against the same forward); prompt "
                "lookup does that job here: --draft-kind ngram drafts from the request's own "
                "prompt and output and the model verifies every draft")


DECODE_STEPS = ("auto", "lean", "fused", "model")


def parse_decode_step(value: str | None, var: str = "MLXBUN_DECODE_STEP") -> str:
    """``auto``, ``lean``, ``fused`` or ``model`` (engine/batch/tune.py)."""
    v = (value or "auto").strip().lower()
    if v not in DECODE_STEPS:
        raise ValueError(f"{var} must be one of {', '.join(DECODE_STEPS)}, not {value!r}")
    return v


def parse_fill(value: str | None, var: str = "MLXBUN_FILL") -> str:
    """``off``/``strict`` (``1``, ``on``: strict); ``echo`` is refused with the reason."""
    v = (value or "off").strip().lower()
    if v in ("", *_FALSE):
        return "off"
    if v in ("strict", *_TRUE):
        return "strict"
    if v == "echo":
        raise ValueError(ECHO_REFUSED)
    raise ValueError(f"{var} must be off or strict, not {value!r}")


def parse_thinking(value: str | None, var: str = "MLXBUN_THINKING") -> bool | None:
    """``true``/``false`` (``on``/``off``, ``1``/``0``, ``yes``/``no``); ``auto`` or
    nothing: the model's own default (None)."""
    v = (value or "auto").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    if v in ("auto", "default"):
        return None
    raise ValueError(f"{var} must be true or false (on/off, 1/0), not {value!r}")


def _int(raw: str, low: int) -> int:
    return max(low, int(raw))


def _count(raw: str) -> int:
    try:
        return max(0, int(raw))
    except ValueError:
        return 0  # a fault count that is no number injects nothing


def _gbs(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        log.warning("MLXBUN_SSD_READ_GBS=%r is not a number; ignored", raw)
        return None
    return value if value > 0 else None


def _flag(raw: str, var: str) -> bool:
    v = raw.strip().lower()
    if v not in (*_TRUE, *_FALSE):
        raise ValueError(f"{var} must be 1 or 0 (on or off), not {raw!r}")
    return v in _TRUE


def _gib(raw: str, var: str) -> int:
    """GiB (any finite value, 0 or more) as bytes."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValueError(f"{var} must be GiB, 0 or more, not {raw!r}")
    return int(value * (1 << 30))


def _number(raw: str, var: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        log.warning("%s=%r is not a number; ignored", var, raw)
        return None


def _interval_ms(raw: str) -> float | None:
    value = _number(raw, "MLXBUN_SWITCH_INTERVAL_MS")
    if value is not None and value <= 0:
        log.warning("MLXBUN_SWITCH_INTERVAL_MS=%r is not positive; ignored", raw)
        return None
    return value


def _positive_int(raw: str) -> int | None:
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def _names(raw: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def _on(raw: str) -> bool:
    return raw.strip().lower() in _TRUE


def _positive_float(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


# (group, field) -> how a set, non-empty variable becomes the field's value
READERS: dict[tuple[str, str], Callable[[str], Any]] = {
    ("engine", "fill"): parse_fill,
    ("engine", "fill_max_span"): lambda raw: _int(raw, 2),
    ("engine", "fill_batch_tokens"): int,
    ("engine", "short_attention"): lambda raw: parse_switch(raw, "MLXBUN_SHORT_ATTENTION"),
    ("engine", "prefill_buckets"): lambda raw: parse_switch(raw, "MLXBUN_PREFILL_BUCKETS"),
    ("engine", "unpack_quantized"): lambda raw: parse_switch(raw, "MLXBUN_UNPACK_QUANTIZED"),
    ("engine", "thinking"): parse_thinking,
    ("engine", "batch_vec_sample"): lambda raw: _flag(raw, "MLXBUN_BATCH_VEC_SAMPLE"),
    ("engine", "batch_ssm"): lambda raw: _flag(raw, "MLXBUN_BATCH_SSM"),


    ("engine", "adapter_mixing"): lambda raw: raw.strip().lower() not in _FALSE,
    ("engine", "switch_interval_ms"): lambda raw: _interval_ms(raw),
    ("engine", "decode_step"): parse_decode_step,
    ("grammar", "enabled"): lambda raw: raw.strip().lower() not in _FALSE,
    ("grammar", "backend"): str.strip,
    ("grammar", "threads"): lambda raw: _int(raw, 1),
    ("models", "convert_precision"): lambda raw: raw.strip().lower() or "auto",
    ("models", "hub_timeout"): _positive_float,
    ("models", "bandwidth_gbs"): lambda raw: _number(raw, "MLXBUN_BANDWIDTH_GBS"),
    ("models", "default_model"): lambda raw: raw.strip().lower() or "embedded",
    ("families", "mtp_hidden"): lambda raw: "post" if raw.strip() == "post" else "pre",
    ("families", "expert_readers"): lambda raw: _int(raw, 1),
    ("families", "expert_prefetch"): lambda raw: raw.strip() not in ("0", "off", "false"),
    ("speculation", "batch_positions"): lambda raw: _int(raw, 1),
    ("speculation", "batch_refeed"): lambda raw: _int(raw, 1),
    ("speculation", "batch_gate"): lambda raw: raw.strip().lower() not in _FALSE,
    ("cache", "ssd_write_behind"): lambda raw: raw.strip().lower() not in _FALSE,
    ("cache", "ssd_read_gbs"): _gbs,
    ("cache", "ssd_spill_queue_bytes"): lambda raw: _gib(raw, "MLXBUN_SSD_SPILL_QUEUE_GB"),
    ("faults", "alloc"): _count,
    ("faults", "device"): _count,
    ("server", "max_body_bytes"): _positive_int,
    ("server", "shutdown_timeout"): _positive_float,
    ("server", "keep_volatile_system"): _on,
    ("server", "p2r_trace"): lambda raw: raw not in ("", "0"),
    ("server", "allow_private_media"): _on,
    ("process", "plugins"): _names,
    ("process", "disable_plugins"): _names,
    ("process", "trace_hooks"): lambda raw: raw.strip().lower() not in _FALSE,
    ("process", "blas"): lambda raw: raw.strip() or "auto",
    ("process", "blas_threads"): _positive_int,
    ("process", "torch"): lambda raw: raw.strip() == "1",
    ("process", "no_open"): lambda raw: raw.strip().lower() not in _FALSE,
}
GRAMMAR_JUMP = "MLXBUN_GRAMMAR_JUMP"  # the reference's name for forced spans: MLXBUN_FILL's alias
# (group, field) -> other variables that set it when its own is not set (the first set
# one wins), and how their value reads
FALLBACKS: dict[tuple[str, str], tuple[tuple[str, ...], Callable[[str], Any]]] = {
    ("engine", "fill"): ((GRAMMAR_JUMP,), lambda raw: parse_fill(raw, GRAMMAR_JUMP)),
    ("process", "blas_threads"): (("OPENBLAS_NUM_THREADS",), lambda raw: 0),
    ("process", "no_open"): (("CI", "PYTEST_CURRENT_TEST"), lambda raw: True),
}
# the spelling before the rename, still read where it was
OLD_NAMES = {"MLXBUN_FILL": "MLX_BUN_FILL", "MLXBUN_FILL_MAX_SPAN": "MLX_BUN_FILL_MAX_SPAN",
              "MLXBUN_GRAMMAR": "MLX_BUN_GRAMMAR"}
