"""The one table of request fields that reach the sampler: each field's type, range,
default, the surfaces that accept it (and how each spells it), and whether it is a
``serve`` flag, an ``mlxbun.yaml`` per-model key or read from a checkpoint's
``generation_config.json``.

Everything else is derived from :data:`FIELDS`: the body checks and the
:class:`~mlxbun_core.engine.sampling.SamplingParams` defaults, the ``serve`` flags (and so
the file's ``serve:`` keys), the ``models:`` keys, what the loader reads, and which fields
each surface reads. ``tests/test_request_fields.py`` fails when one of them drifts.

Plain data with no imports of ours: the loader, the engine, the config reader and the
surfaces all read it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

Kind = Literal["number", "integer", "boolean", "token_bias", "curve"]
Surface = Literal["chat", "completions", "responses", "anthropic", "webchat"]

SURFACES: tuple[Surface, ...] = ("chat", "completions", "responses", "anthropic", "webchat")
INT32_MAX = 2**31 - 1
PENALTY_MAX = 2.0  # OpenAI's documented range for presence / frequency penalties
BIAS_MAX = 100.0  # OpenAI's documented range for a logit_bias value
# Every float a sampler kernel sees stays far inside float32: a Python int beyond
# int64 reaches MLX as a failed cast, a float beyond float32 as inf (then NaN).
FLOAT_MAX = 1e6
SEED_MAX = 2**64 - 1

_TYPES: dict[Kind, tuple[type, ...]] = {"number": (float, int), "integer": (int,),
                                        "boolean": (bool,)}
_WORDS: dict[Kind, str] = {"number": "a number", "integer": "an integer",
                           "boolean": "a boolean"}


@dataclass(frozen=True)
class RequestField:
    """One request field: checked as its ``kind`` with ``lo``..``hi`` (``sentinels`` are
    allowed outside the range), ``default`` when neither the request nor a server default
    sets it."""

    name: str  # the engine's name (SamplingParams' attribute, mlx_lm.server's field)
    kind: Kind
    default: Any
    lo: float | None = None
    hi: float | None = None
    sentinels: tuple[int, ...] = ()  # values that mean "unset" (top_logprobs: -1)
    on: tuple[Surface, ...] = SURFACES  # the surfaces that read it from a body
    renamed: tuple[tuple[Surface, str], ...] = ()  # where a surface spells it otherwise
    flag: bool = False  # a ``serve --name-with-dashes`` flag (and a ``serve:`` file key)
    per_model: bool = False  # a key under a model in ``mlxbun.yaml``'s ``models:``
    checkpoint: bool = False  # read from the checkpoint's generation_config.json
    # the type mlx_lm.server's check names where it accepts less than we do (a type error
    # reads as its own: "xtc_probability must be of type float"); None: ``types``
    mlx_lm_type: str | None = None

    def spelling(self, surface: Surface) -> str | None:
        """The body key ``surface`` reads this field from (None: it does not read it)."""
        if surface not in self.on:
            return None
        return dict(self.renamed).get(surface, self.name)

    @property
    def types(self) -> tuple[type, ...]:
        """What ``isinstance`` must accept (checked kinds only)."""
        return _TYPES[self.kind]

    @property
    def expected(self) -> str:
        """The type in words, for an error message."""
        return _WORDS[self.kind]

    @property
    def checked(self) -> bool:
        """Checked here (a scalar); a token bias map and a curve have their own parsers."""
        return self.kind in _TYPES

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")

    def fits(self, value: Any) -> bool:
        """``value`` has this field's type; a boolean is never taken for a number (it is
        always a client's mistake, though mlx-lm takes it)."""
        return isinstance(value, self.types) and (
            self.kind == "boolean" or not isinstance(value, bool))

    def out_of_range(self, value: Any, name: str | None = None) -> str | None:
        """Why ``value`` (of the right type), sent as ``name``, is out of range; None: it
        is in range."""
        name = name or self.name
        if value in self.sentinels:
            return None
        if self.lo is not None and value < self.lo:
            return f"{name} must be at least {self.lo}"
        if self.hi is not None and value > self.hi:
            return f"{name} must be at most {self.hi}"
        return None

    def problem(self, value: Any, name: str | None = None) -> str | None:
        """What is wrong with ``value`` sent as ``name`` (this field's own by default)."""
        if not self.fits(value):
            return f"{name or self.name} must be {self.expected}"
        return self.out_of_range(value, name)


def _defaultable(name: str, kind: Kind, default: Any, lo: float, hi: float, *,
                 checkpoint: bool = False) -> RequestField:
    """A sampler setting a server may default for every request: a ``serve`` flag and a
    per-model key, sent on every surface."""
    return RequestField(name, kind, default, lo, hi, flag=True, per_model=True,
                        checkpoint=checkpoint)


_OPENAI: tuple[Surface, ...] = ("chat", "completions")  # OpenAI's own log-prob fields

FIELDS: tuple[RequestField, ...] = (
    # mlx_lm.server's validate_model_parameters, plus upper bounds mlx-lm leaves to its
    # kernels (which would fail mid-request otherwise)
    _defaultable("temperature", "number", 0.0, 0, FLOAT_MAX, checkpoint=True),
    _defaultable("top_p", "number", 0.0, 0, 1, checkpoint=True),
    _defaultable("top_k", "integer", 0, 0, INT32_MAX, checkpoint=True),
    _defaultable("min_p", "number", 0.0, 0, 1, checkpoint=True),
    _defaultable("repetition_penalty", "number", None, 0, FLOAT_MAX,
                 checkpoint=True),
    _defaultable("repetition_context_size", "integer", 20, 0, INT32_MAX),
    _defaultable("presence_penalty", "number", None, -PENALTY_MAX, PENALTY_MAX),
    _defaultable("presence_context_size", "integer", 20, 0, INT32_MAX),
    _defaultable("frequency_penalty", "number", None, -PENALTY_MAX, PENALTY_MAX),
    _defaultable("frequency_context_size", "integer", 20, 0, INT32_MAX),
    RequestField("logprobs", "boolean", False, on=_OPENAI),  # completions: or 0..20
    RequestField("top_logprobs", "integer", -1, 0, 11, sentinels=(-1,), on=_OPENAI),
    replace(_defaultable("xtc_probability", "number", 0.0, 0, 1), mlx_lm_type="float"),
    # mlx_lm.server says 1; apply_xtc raises past 0.5
    replace(_defaultable("xtc_threshold", "number", 0.1, 0, 0.5), mlx_lm_type="float"),
    _defaultable("seed", "integer", None, 0, SEED_MAX),
    # token id -> bias in ±BIAS_MAX (engine/sampling.py); not Anthropic's
    RequestField("logit_bias", "token_bias", None,
                 on=("chat", "completions", "responses", "webchat")),
    # a tone curve replacing temperature (engine/hlg.py; --hlg-* set the server's default)
    RequestField("hlg", "curve", None, on=("chat", "completions", "responses", "anthropic")),
)
BY_NAME: dict[str, RequestField] = {f.name: f for f in FIELDS}


def accepted(surface: Surface) -> tuple[RequestField, ...]:
    """The fields ``surface`` reads from a body."""
    return tuple(f for f in FIELDS if surface in f.on)


def flag_fields() -> tuple[RequestField, ...]:
    """The fields ``mlxbun serve`` takes as flags (a server-wide default)."""
    return tuple(f for f in FIELDS if f.flag)


def per_model_names() -> tuple[str, ...]:
    """The sampling keys a model's entry in ``mlxbun.yaml`` may set."""
    return tuple(f.name for f in FIELDS if f.per_model)


def checkpoint_names() -> tuple[str, ...]:
    """The sampling defaults read from a checkpoint's ``generation_config.json``."""
    return tuple(f.name for f in FIELDS if f.checkpoint)
