"""The process's run configuration: one typed, frozen object built once at start-up and
read by the code below it, which never reads the environment for a setting itself.

``mlxbun serve`` builds it from flags > environment (``MLXBUN_*``) > the config file >
defaults (:func:`mlxbun_core.config.runtime.build`) and :func:`install`\\ s it before the
engine loads; anything else (a CLI verb, a bench, an in-process engine) gets
:func:`from_environ` of the environment on its first :func:`current`. Tests change it
for a block with :func:`overridden`, never through the environment.

This module sits on the records floor (it imports only ``env_readers``, how a variable's
text becomes a value) so every floor can read it; groups are by concern, each field names
the variable that sets it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .env_readers import DEFAULT_FILL_MAX_SPAN, FALLBACKS, OLD_NAMES, READERS


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
    # a batch's decode forward: auto (timed on a GPU at start, engine/batch/tune.py), or
    # lean, fused (lean, gate and up in one matmul) or model (mlx-lm's own call)
    decode_step: str = field(default="auto", metadata={"env": "MLXBUN_DECODE_STEP"})


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


def from_environ(environ: Mapping[str, str]) -> RunConfig:
    """The configuration ``environ`` (the process's environment, at start-up) sets;
    ValueError names the variable whose value is wrong."""
    groups: dict[str, dict[str, Any]] = {}
    for (group, name), var in env_names().items():
        raw = environ.get(var, environ.get(OLD_NAMES.get(var, ""), ""))
        if raw:
            groups.setdefault(group, {})[name] = READERS[group, name](raw)
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
