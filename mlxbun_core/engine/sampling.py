"""Sampling parameters: parsed and validated with mlx_lm.server's rules (its fields,
types and ranges, messages in words), turned into mlx-lm's own sampler and logits
processors (so behaviour matches it)."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, cast

from ..contract import LogitsProcessor, Sampler, Tokenizer
from ..errors import BadRequest
from .hlg import ToneCurve, parse_hlg

INT32_MAX = 2**31 - 1
PENALTY_MAX = 2.0  # OpenAI's documented range for presence / frequency penalties
BIAS_MAX = 100.0  # OpenAI's documented range for a logit_bias value
# Every float a sampler kernel sees stays far inside float32: a Python int beyond
# int64 reaches MLX as a failed cast, a float beyond float32 as inf (then NaN).
FLOAT_MAX = 1e6
_TOKEN_ID = re.compile(r"-?[0-9]{1,32}")  # range-checked against the vocabulary later
# (field, types, min, max, whitelist) — mlx_lm.server's validate_model_parameters, plus
# upper bounds mlx-lm leaves to its kernels (which would fail mid-request otherwise)
_Rule = tuple[str, "type | tuple[type, ...]", "float | None", "float | None",
              "tuple[int, ...] | None"]
_RULES: list[_Rule] = [
    ("temperature", (float, int), 0, FLOAT_MAX, None),
    ("top_p", (float, int), 0, 1, None),
    ("top_k", int, 0, INT32_MAX, None),
    ("min_p", (float, int), 0, 1, None),
    ("repetition_penalty", (float, int), 0, FLOAT_MAX, None),
    ("repetition_context_size", int, 0, INT32_MAX, None),
    ("presence_penalty", (float, int), -PENALTY_MAX, PENALTY_MAX, None),
    ("presence_context_size", int, 0, INT32_MAX, None),
    ("frequency_penalty", (float, int), -PENALTY_MAX, PENALTY_MAX, None),
    ("frequency_context_size", int, 0, INT32_MAX, None),
    ("logprobs", bool, None, None, None),
    ("top_logprobs", int, 0, 11, (-1,)),
    ("xtc_probability", (float, int), 0, 1, None),
    # mlx_lm.server says 1; apply_xtc raises past 0.5
    ("xtc_threshold", (float, int), 0, 0.5, None),
    ("seed", int, 0, 2**64 - 1, None),
]
_FLOATS = {name for name, types, *_ in _RULES if types == (float, int)}
_WORDS = {(float, int): "a number", int: "an integer", bool: "a boolean"}
_KINDS = {str: "a string", list: "an array", dict: "an object", bool: "a boolean",
          type(None): "null"}


def described(value: object) -> str:
    """A JSON value as an error message names it: ``the string 'hot'``, ``an array``, ``1.5``."""
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return _KINDS.get(type(value), type(value).__name__)


def type_error(name: str, expected: str, value: object, param: str | None = None) -> BadRequest:
    """``<name> must be <expected> (got <value>)``: the field, the type in words, what came."""
    return BadRequest(f"{name} must be {expected} (got {described(value)})",
                      param=param or name)


def _check(name: str, value: Any, types: type | tuple[type, ...], lo: float | None,
           hi: float | None, whitelist: tuple[int, ...] | None) -> None:
    # bool is an int subclass; mlx-lm accepts it where int is allowed, we do not
    # accept it for numeric fields because it is always a client mistake.
    if not isinstance(value, types) or (types is not bool and isinstance(value, bool)):
        raise type_error(name, _WORDS[types], value)
    if whitelist and value in whitelist:
        return
    number = cast(float, value)  # an int, a float or a bool by now
    if lo is not None and number < lo:
        raise BadRequest(f"{name} must be at least {lo}", param=name)
    if hi is not None and number > hi:
        raise BadRequest(f"{name} must be at most {hi}", param=name)


def check_field(name: str, value: Any, types: type | tuple[type, ...], lo: float | None = None,
                hi: float | None = None) -> Any:
    """``value`` when it has the type (``int``, ``bool`` or ``(float, int)``) and range."""
    _check(name, value, types, lo, hi, None)
    return value


def _logit_bias(bias: object) -> dict[int, float]:
    """``{"token id": bias}``: decimal ids, numeric biases within OpenAI's ±100."""
    if not isinstance(bias, dict):
        raise type_error("logit_bias", "an object of token ids to numbers", bias)
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and _TOKEN_ID.fullmatch(key)) \
                or not isinstance(value, (int, float)) or isinstance(value, bool):
            raise BadRequest("logit_bias must be a dict of int to float (token id to a "
                             "number)", param="logit_bias")
        if not -BIAS_MAX <= value <= BIAS_MAX:
            raise BadRequest(f"logit_bias values must be between -{BIAS_MAX:g} and "
                             f"{BIAS_MAX:g}", param="logit_bias")
        out[int(key)] = float(value)
    return out


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    presence_context_size: int = 20
    frequency_penalty: float | None = None
    frequency_context_size: int = 20
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = -1
    hlg: ToneCurve | None = None  # a tone curve replacing the temperature sampler (hlg.py)
    # e.g. a grammar mask, applied last
    extra_processors: list[LogitsProcessor] = field(default_factory=list)

    @classmethod
    def from_body(cls, body: dict[str, Any], defaults: dict[str, Any] | None = None,
                  accepted: Collection[str] | None = None) -> SamplingParams:
        """Request values win over ``defaults`` (generation_config.json + server flags).
        ``accepted``: the sampler fields the surface takes from its body (None: all of
        them); the others are not read (a surface without them ignores them)."""
        names = {f.name for f in fields(cls)} - {"extra_processors", "hlg"}
        merged = {k: v for k, v in (defaults or {}).items() if k in names and v is not None}
        given = names if accepted is None else names & set(accepted)
        reads_hlg = accepted is None or "hlg" in accepted
        merged["hlg"] = parse_hlg(body.get("hlg") if reads_hlg else None,
                                  (defaults or {}).get("hlg"))
        for name in given:
            if body.get(name) is not None:
                merged[name] = body[name]
        for name, types, lo, hi, wl in _RULES:
            if name in given and body.get(name) is not None:
                _check(name, body[name], types, lo, hi, wl)
        for name in _FLOATS & merged.keys():  # kernels take floats; ints become them here
            merged[name] = float(merged[name])
        if merged.get("logit_bias") is not None:
            merged["logit_bias"] = _logit_bias(merged["logit_bias"])
        return cls(**merged)

    def check_vocab(self, vocab_size: int) -> None:
        """Limits that depend on the model: mlx-lm's kernels would fail mid-request."""
        if self.top_k >= vocab_size:
            raise BadRequest(f"top_k must be less than the vocabulary size ({vocab_size})",
                             param="top_k")
        bad = [k for k in (self.logit_bias or {}) if not 0 <= k < vocab_size]
        if bad:
            raise BadRequest(f"logit_bias token id {bad[0]} is outside the vocabulary "
                             f"(0..{vocab_size - 1})", param="logit_bias")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    def sampler(self, tokenizer: Tokenizer) -> Sampler:
        """mlx-lm's sampler for these settings; equal settings share one sampler object,
        so the batch lane samples rows with the same settings in one call."""
        # as mlx_lm.server: newline and EOS are never removed by XTC
        curve = self.hlg.sampler(self.temperature) if self.hlg is not None else None
        if curve is not None:
            return curve
        xtc_special = tuple(tokenizer.encode("\n")) + tuple(sorted(tokenizer.eos_token_ids))
        return _sampler((self.temperature, self.top_p, self.min_p, self.top_k,
                         self.xtc_probability, self.xtc_threshold, xtc_special))

    def logits_processors(self) -> list[LogitsProcessor]:
        from mlx_lm.sample_utils import make_logits_processors

        procs = make_logits_processors(
            self.logit_bias, self.repetition_penalty, self.repetition_context_size,
            self.presence_penalty, self.presence_context_size,
            self.frequency_penalty, self.frequency_context_size)
        return procs + list(self.extra_processors)


@lru_cache(maxsize=256)
def _sampler(key: tuple[float, float, float, int, float, float, tuple[int, ...]]) -> Sampler:
    from mlx_lm.sample_utils import make_sampler

    temp, top_p, min_p, top_k, xtc_probability, xtc_threshold, xtc_special = key
    return make_sampler(temp=temp, top_p=top_p, min_p=min_p, top_k=top_k,
                        xtc_probability=xtc_probability, xtc_threshold=xtc_threshold,
                        xtc_special_tokens=list(xtc_special))


def max_tokens_from(body: dict[str, Any], default: int | None) -> int | None:
    """``max_completion_tokens`` wins over ``max_tokens``; unset means no cap."""
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            return max_tokens_field(body[name], name, default)
    return default


def max_tokens_field(value: Any, name: str, default: int | None) -> int | None:
    """A completion limit sent as ``name`` (each surface has its own): a positive
    integer, or ``default`` when it is None."""
    if value is None:
        return default
    _check(name, value, int, 1, None, None)
    limit: int = value
    return limit


def stop_sequences(body: dict[str, Any], name: str = "stop") -> list[str]:
    stop = body.get(name)
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest(f"{name} must be a string or a list of strings", param=name)
    return [s for s in stop if s]
