"""Sampling parameters: parsed and validated with mlx_lm.server's rules (its fields,
types and ranges, messages in words; the table is :mod:`mlxbun_core.request_fields`),
turned into mlx-lm's own sampler and logits processors (so behaviour matches it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, cast

from ..contract import LogitsProcessor, Sampler, Tokenizer
from ..errors import BadRequest
from ..request_fields import BIAS_MAX, BY_NAME, FIELDS, RequestField, Surface
from .hlg import ToneCurve, parse_hlg

_D = {f.name: f.default for f in FIELDS}  # the dataclass's defaults, from the table

_TOKEN_ID = re.compile(r"-?[0-9]{1,32}")  # range-checked against the vocabulary later
_FLOATS = {f.name for f in FIELDS if f.kind == "number"}
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


def mlx_lm_type_error(name: str, types: type | tuple[type, ...] | str,
                      param: str | None = None) -> BadRequest:
    """mlx_lm.server's own words for a field it checks that came with the wrong type:
    ``<name> must be of type <type>``, the type as its check names it (``bool``, ``int``,
    ``('float', 'int')``), so a client that reads mlx-lm's errors reads ours."""
    if isinstance(types, tuple) and len(types) == 1:
        types = types[0]
    if isinstance(types, tuple):
        named = str(tuple(t.__name__ for t in types))
    else:
        named = types if isinstance(types, str) else types.__name__
    return BadRequest(f"{name} must be of type {named}", param=param or name)


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
        raise mlx_lm_type_error("logit_bias", dict)
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


def _sent(body: dict[str, Any], surface: Surface | None) -> dict[str, tuple[str, Any]]:
    """name -> (the key it came as, its value) for each table field ``surface`` reads
    that the body sets (null counts as unset)."""
    out: dict[str, tuple[str, Any]] = {}
    for f in FIELDS:
        spelled = f.name if surface is None else f.spelling(surface)
        if spelled is not None and body.get(spelled) is not None:
            out[f.name] = (spelled, body[spelled])
    return out


def _check_field(f: RequestField, spelled: str, value: Any) -> None:
    """``value`` sent as ``spelled`` has ``f``'s type and range, else a 400 naming it."""
    if not f.fits(value):
        raise mlx_lm_type_error(spelled, f.mlx_lm_type or f.types)
    said = f.out_of_range(value, spelled)
    if said is not None:
        raise BadRequest(said, param=spelled)


@dataclass
class SamplingParams:
    """The sampler's settings; every field but ``extra_processors`` is a row of
    :data:`~mlxbun_core.request_fields.FIELDS`, which gives its default."""

    temperature: float = _D["temperature"]
    top_p: float = _D["top_p"]
    top_k: int = _D["top_k"]
    min_p: float = _D["min_p"]
    xtc_probability: float = _D["xtc_probability"]
    xtc_threshold: float = _D["xtc_threshold"]
    repetition_penalty: float | None = _D["repetition_penalty"]
    repetition_context_size: int = _D["repetition_context_size"]
    presence_penalty: float | None = _D["presence_penalty"]
    presence_context_size: int = _D["presence_context_size"]
    frequency_penalty: float | None = _D["frequency_penalty"]
    frequency_context_size: int = _D["frequency_context_size"]
    logit_bias: dict[int, float] | None = _D["logit_bias"]
    seed: int | None = _D["seed"]
    logprobs: bool = _D["logprobs"]
    top_logprobs: int = _D["top_logprobs"]
    hlg: ToneCurve | None = _D["hlg"]  # a tone curve replacing the temperature sampler (hlg.py)
    # e.g. a grammar mask, applied last
    extra_processors: list[LogitsProcessor] = field(default_factory=list)

    @classmethod
    def from_body(cls, body: dict[str, Any], defaults: dict[str, Any] | None = None,
                  surface: Surface | None = None) -> SamplingParams:
        """Request values win over ``defaults`` (generation_config.json + server flags).
        ``surface``: whose body it is; it reads the fields that surface accepts, under its
        spelling (None: every field, by its own name); the others are not read."""
        defaults = defaults or {}
        merged = {k: v for k, v in defaults.items() if k in BY_NAME and v is not None}
        sent = _sent(body, surface)
        merged["hlg"] = parse_hlg(sent.get("hlg", (None, None))[1], defaults.get("hlg"))
        for name, (spelled, value) in sent.items():
            if BY_NAME[name].checked:
                _check_field(BY_NAME[name], spelled, value)
            if name != "hlg":
                merged[name] = value
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
    if not isinstance(value, int) or isinstance(value, bool):
        raise mlx_lm_type_error(name, int)
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
