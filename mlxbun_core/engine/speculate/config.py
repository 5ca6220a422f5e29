"""Who speculates, and how far: the server's ``--draft-kind ngram|mtp`` and the request's
``draft_kind`` field.

A request may turn prompt lookup (``"draft_kind": "ngram"``) or the model's own
multi-token-prediction head (``"mtp"``) on, or speculation off (``"none"``), for
itself, whatever the server default, and set its own ``num_draft_tokens``; the same
field names on every surface (chat, completions, Messages, Responses), read through
:func:`speculation_field`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...errors import BadRequest

NGRAM = "ngram"
MTP = "mtp"
NONE = "none"
KINDS = (NGRAM, MTP, NONE)
DEFAULT_DRAFT_TOKENS = 10  # Prompt Lookup Decoding's num_pred_tokens (the spec's default)
MAX_DRAFT_TOKENS = 64
# plain steps whose lookup guessed the next token right, in a row, before drafts are sent
# (one hit is common in prose, where single-token matches abound; two rarely are: measured
# on SmolLM2 replies, 2 kept the echo gains and sent almost no drafts on prose)
HIT_STREAK = 2


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings for a server or one request (``num_draft_tokens`` 0 under
    ``mtp``: the head's own default)."""

    kind: str = NGRAM
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS
    ngram_max: int = 3
    ngram_min: int = 1

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_draft_tokens": self.num_draft_tokens,
                "ngram_max": self.ngram_max, "ngram_min": self.ngram_min}


@dataclass(frozen=True)
class SpecRequest:
    """A request's own choice: ``kind`` ("ngram" / "mtp" / "none", None: the server's) and
    ``num_draft_tokens`` (None: the server's)."""

    kind: str | None = None
    num_draft_tokens: int | None = None


def server_config(kind: str | None, num_draft_tokens: int | None = None,
                  ngram_max: int = 3, ngram_min: int = 1) -> SpecConfig | None:
    """The server-wide setting from ``--draft-kind`` and friends (None: no speculation)."""
    if kind in (None, NONE):
        return None
    if kind == MTP:
        if num_draft_tokens is not None and not 1 <= num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"--num-draft-tokens must be between 1 and {MAX_DRAFT_TOKENS}")
        return SpecConfig(MTP, num_draft_tokens or 0)
    if kind != NGRAM:
        raise ValueError(f"--draft-kind {kind!r}: only 'ngram' and 'mtp' run without a "
                         "draft model")
    if not 1 <= ngram_min <= ngram_max:
        raise ValueError("--ngram-min must be between 1 and --ngram-max")
    n = DEFAULT_DRAFT_TOKENS if num_draft_tokens is None else num_draft_tokens
    if not 1 <= n <= MAX_DRAFT_TOKENS:
        raise ValueError(f"--num-draft-tokens must be between 1 and {MAX_DRAFT_TOKENS}")
    return SpecConfig(NGRAM, n, ngram_max, ngram_min)


def speculation_field(body: dict[str, Any], kind_name: str = "draft_kind",
                      tokens_name: str = "num_draft_tokens") -> SpecRequest | None:
    """The request's ``draft_kind`` / ``num_draft_tokens`` (None when neither is sent);
    a 400 naming the field for anything else."""
    kind, n = body.get(kind_name), body.get(tokens_name)
    if kind is None and n is None:
        return None
    if kind is not None and kind not in KINDS:
        raise BadRequest(f"{kind_name} must be one of {', '.join(map(repr, KINDS))} "
                         f"(got {kind!r})" if isinstance(kind, str) else
                         f"{kind_name} must be a string", param=kind_name)
    if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
        raise BadRequest(f"{tokens_name} must be of type int", param=tokens_name)  # mlx-lm's
    if n is not None and not 1 <= n <= MAX_DRAFT_TOKENS:
        raise BadRequest(f"{tokens_name} must be an integer from 1 to {MAX_DRAFT_TOKENS}",
                         param=tokens_name)
    return SpecRequest(kind, n)


def resolve(server: SpecConfig | None, asked: SpecRequest | None) -> SpecConfig | None:
    """What one request runs with: its own choice over the server's."""
    if asked is None:
        return server
    if asked.kind == NONE:
        return None
    if asked.kind is None and server is None:
        return None  # only a token count: nothing to count without lookup
    base = server or SpecConfig()
    if asked.kind is not None and asked.kind != base.kind:
        base = SpecConfig(MTP, 0) if asked.kind == MTP else SpecConfig()
    if asked.num_draft_tokens is not None:
        base = replace(base, num_draft_tokens=asked.num_draft_tokens)
    return base


class SpecUnavailable(ValueError):
    """``--draft-kind mtp`` for a model whose checkpoint has no multi-token-prediction
    head (start-up refuses it)."""


def check_mtp(config: SpecConfig | None, has_head: bool, model_id: str) -> None:
    """A 400 for a request asking for the MTP head of a model without one."""
    if config is not None and config.kind == MTP and not has_head:
        raise BadRequest(f"draft_kind 'mtp': model {model_id} has no multi-token-prediction "
                         "head", param="draft_kind")
