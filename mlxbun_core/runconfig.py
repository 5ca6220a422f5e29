"""The process's run configuration: one typed, frozen object built once at start-up and
read by the code below it, which never reads the environment for a setting itself.

``mlxbun serve`` builds it from flags > environment (``MLXBUN_*``) > the config file >
defaults (:func:`mlxbun_core.config.runtime.build`) and :func:`install`\\ s it before the
engine loads; anything else (a CLI verb, a bench, an in-process engine) gets
:func:`from_environ` of the environment on its first :func:`current`. Tests change it
for a block with :func:`overridden`, never through the environment.

This module sits on the records floor (it imports nothing of ours) so every floor can
read it; groups are by concern, each field names the variable that sets it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
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


@dataclass(frozen=True)
class EngineConfig:
    """How the engine shapes its forward passes."""

    fill: str = field(default="off", metadata={"env": "MLXBUN_FILL"})
    fill_max_span: int = field(default=DEFAULT_FILL_MAX_SPAN,
                               metadata={"env": "MLXBUN_FILL_MAX_SPAN"})
    # query positions one shared fill step may run; None: by device (CPU 0, GPU 512)
    fill_batch_tokens: int | None = field(default=None,
                                          metadata={"env": "MLXBUN_FILL_BATCH_TOKENS"})
    short_attention: str = field(default="auto", metadata={"env": "MLXBUN_SHORT_ATTENTION"})
    prefill_buckets: str = field(default="auto", metadata={"env": "MLXBUN_PREFILL_BUCKETS"})
    # quantized layers dequantize for passes of many rows (auto: on CUDA; engine/wide_quant.py)
    unpack_quantized: str = field(default="auto", metadata={"env": "MLXBUN_UNPACK_QUANTIZED"})
    # the chat template's enable_thinking when a request says nothing (None: the model's)
    thinking: bool | None = field(default=None, metadata={"env": "MLXBUN_THINKING"})
    # rows sharing one sampler draw in one call; off: a call per row (an A/B lever)
    batch_vec_sample: bool = field(default=True, metadata={"env": "MLXBUN_BATCH_VEC_SAMPLE"})
    # models with recurrent (SSM) layers ride the batch; off: they take the serial lane
    batch_ssm: bool = field(default=True, metadata={"env": "MLXBUN_BATCH_SSM"})
    # rows of different LoRA sets may share a batch pass (serve --adapter-mixing)
    adapter_mixing: bool = field(default=True, metadata={"env": "MLXBUN_ADAPTER_MIXING"})
    # the interpreter's thread switch interval in a server (sys.setswitchinterval), in ms:
    # how long the worker, its pass's result ready, may wait for the event loop's thread
    # to let go of the GIL; None: Python's own, 5 (an A/B lever: no step rate changed on
    # the CPU, bench/NOTES.md "Host work per served step")
    switch_interval_ms: float | None = field(default=None,
                                             metadata={"env": "MLXBUN_SWITCH_INTERVAL_MS"})


@dataclass(frozen=True)
class GrammarConfig:
    """Structured output's backends."""

    enabled: bool = field(default=True, metadata={"env": "MLXBUN_GRAMMAR"})
    # the backend when serve's --grammar-backend did not pick one (None: llguidance)
    backend: str | None = field(default=None, metadata={"env": "MLXBUN_GRAMMAR_BACKEND"})
    # xgrammar's compiler threads (None: the cores, at most 8)
    threads: int | None = field(default=None, metadata={"env": "MLXBUN_GRAMMAR_THREADS"})


@dataclass(frozen=True)
class ModelsConfig:
    """Model files, conversions and the hub."""

    # what a GGUF converts to: auto, float32, float16, bfloat16, q2-q8 (checked where used)
    convert_precision: str = field(default="auto",
                                   metadata={"env": "MLXBUN_CONVERT_PRECISION"})
    # seconds the hub may stay silent on a call (None: 30)
    hub_timeout: float | None = field(default=None, metadata={"env": "MLXBUN_HUB_TIMEOUT"})
    # the memory bandwidth fit's decode prediction assumes (None: measured or looked up)
    bandwidth_gbs: float | None = field(default=None,
                                        metadata={"env": "MLXBUN_BANDWIDTH_GBS"})
    # with no model named: "embedded" (the embedded default when installed) or "auto"
    # (the largest local model that fits)
    default_model: str = field(default="embedded", metadata={"env": "MLXBUN_DEFAULT_MODEL"})


@dataclass(frozen=True)
class FamilyConfig:
    """Family plugins' settings (measuring switches, streaming)."""

    # Qwen3.5's MTP head fed the hidden states before the final norm ("pre") or after
    mtp_hidden: str = field(default="pre", metadata={"env": "MLXBUN_MTP_HIDDEN"})
    # GLM-5.2's streamed experts: reader threads, and prefetch of the next layer's
    expert_readers: int = field(default=4, metadata={"env": "MLXBUN_EXPERT_READERS"})
    expert_prefetch: bool = field(default=True, metadata={"env": "MLXBUN_EXPERT_PREFETCH"})


@dataclass(frozen=True)
class SpeculationConfig:
    """The batch lane's draft windows; None: the device's default."""

    batch_positions: int | None = field(default=None,
                                        metadata={"env": "MLXBUN_SPEC_BATCH_POSITIONS"})
    batch_refeed: int | None = field(default=None, metadata={"env": "MLXBUN_SPEC_BATCH_REFEED"})
    # MTP batch rows and lone MTP streams draft only while their drafts land
    # (speculate/gate.py); off: every step
    batch_gate: bool = field(default=True, metadata={"env": "MLXBUN_SPEC_BATCH_GATE"})


@dataclass(frozen=True)
class CacheConfig:
    """The SSD tier's settings that have no flag."""

    ssd_write_behind: bool = field(default=True, metadata={"env": "MLXBUN_SSD_WRITEBEHIND"})
    ssd_read_gbs: float | None = field(default=None, metadata={"env": "MLXBUN_SSD_READ_GBS"})
    # bytes queued writes may hold (None: the default, raised to the RAM cache's size)
    ssd_spill_queue_bytes: int | None = field(default=None,
                                              metadata={"env": "MLXBUN_SSD_SPILL_QUEUE_GB"})


@dataclass(frozen=True)
class FaultConfig:
    """Test-only fault injection (docs/development.md)."""

    alloc: int = field(default=0, metadata={"env": "MLXBUN_FAULT_ALLOC"})
    device: int = field(default=0, metadata={"env": "MLXBUN_FAULT_DEVICE"})


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP surfaces' settings that have no serve flag (or one folded in here)."""

    max_body_bytes: int | None = field(default=None, metadata={"env": "MLXBUN_MAX_BODY_BYTES"})
    shutdown_timeout: float | None = field(default=None,
                                           metadata={"env": "MLXBUN_SHUTDOWN_TIMEOUT"})
    keep_volatile_system: bool = field(default=False,
                                       metadata={"env": "MLXBUN_KEEP_VOLATILE_SYSTEM"})
    p2r_trace: bool = field(default=False, metadata={"env": "MLXBUN_P2R_TRACE"})
    # media URLs may reach private, loopback and link-local hosts (serve
    # --allow-private-media)
    allow_private_media: bool = field(default=False,
                                      metadata={"env": "MLXBUN_ALLOW_PRIVATE_MEDIA"})


@dataclass(frozen=True)
class ProcessConfig:
    """How an mlxbun process starts: its plugins, BLAS, torch and the browser."""

    # installed plugins allowed (None: all), and plugins of any kind left out ("webapp":
    # a server of the inference APIs alone)
    plugins: tuple[str, ...] | None = field(default=None, metadata={"env": "MLXBUN_PLUGINS"})
    disable_plugins: tuple[str, ...] = field(default=(),
                                             metadata={"env": "MLXBUN_DISABLE_PLUGINS"})
    trace_hooks: bool = field(default=False, metadata={"env": "MLXBUN_TRACE_HOOKS"})
    # MLX's CPU matrix products: "auto" (OpenBLAS if found), "reference", or a library file
    blas: str = field(default="auto", metadata={"env": "MLXBUN_BLAS"})
    # OpenBLAS threads; None: one core fewer than the process may use, 0: OpenBLAS's own
    # choice (what a set OPENBLAS_NUM_THREADS means)
    blas_threads: int | None = field(default=None, metadata={"env": "MLXBUN_BLAS_THREADS"})
    # keep an installed torch importable (a third-party plugin or job runner needs it)
    torch: bool = field(default=False, metadata={"env": "MLXBUN_TORCH"})
    # never open the web app in a browser (CI or a test run set it too)
    no_open: bool = field(default=False, metadata={"env": "MLXBUN_NO_OPEN"})


@dataclass(frozen=True)
class RunConfig:
    """Every setting below start-up, grouped by concern."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    families: FamilyConfig = field(default_factory=FamilyConfig)
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    process: ProcessConfig = field(default_factory=ProcessConfig)

    def changed(self, **groups: Mapping[str, Any]) -> RunConfig:
        """A copy with fields of groups replaced: ``changed(engine={"fill": "strict"})``."""
        return replace(self, **{g: replace(getattr(self, g), **v) for g, v in groups.items()})

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {g.name: {f.name: getattr(getattr(self, g.name), f.name)
                         for f in fields(getattr(self, g.name))} for g in fields(self)}


def env_names() -> dict[tuple[str, str], str]:
    """``(group, field)`` -> the variable that sets it."""
    blank = RunConfig()
    return {(g.name, f.name): f.metadata["env"] for g in fields(blank)
            for f in fields(getattr(blank, g.name))}


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
_READERS: dict[tuple[str, str], Callable[[str], Any]] = {
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
_OLD_NAMES = {"MLXBUN_FILL": "MLX_BUN_FILL", "MLXBUN_FILL_MAX_SPAN": "MLX_BUN_FILL_MAX_SPAN",
              "MLXBUN_GRAMMAR": "MLX_BUN_GRAMMAR"}


def from_environ(environ: Mapping[str, str]) -> RunConfig:
    """The configuration ``environ`` (the process's environment, at start-up) sets;
    ValueError names the variable whose value is wrong."""
    groups: dict[str, dict[str, Any]] = {}
    for (group, name), var in env_names().items():
        raw = environ.get(var, environ.get(_OLD_NAMES.get(var, ""), ""))
        if raw:
            groups.setdefault(group, {})[name] = _READERS[group, name](raw)
    for (group, name), (others, read) in FALLBACKS.items():
        raw = next((environ[v] for v in others if environ.get(v)), "")
        if raw and name not in groups.get(group, {}):  # the field's own variable wins
            groups.setdefault(group, {})[name] = read(raw)
    return RunConfig().changed(**groups)

_installed: RunConfig | None = None


def install(config: RunConfig) -> RunConfig:
    """Make ``config`` the process's (start-up does, once)."""
    global _installed
    _installed = config
    return config


def current() -> RunConfig:
    """The installed configuration; without one, the environment's, read once."""
    if _installed is None:
        return install(from_environ(os.environ))
    return _installed


def settled() -> RunConfig:
    """:func:`current`, or the defaults while the environment holds a wrong value: for
    what runs before start-up checks the environment and refuses it with the reason
    (BLAS routing as MLX loads, plugins, the CLI's parser), which must not fail first."""
    try:
        return current()
    except ValueError:
        return RunConfig()


@contextmanager
def overridden(**groups: Mapping[str, Any]) -> Iterator[RunConfig]:
    """The current configuration with some fields changed, for a block (tests, benches)."""
    global _installed
    saved = _installed
    try:
        yield install(current().changed(**groups))
    finally:
        _installed = saved
