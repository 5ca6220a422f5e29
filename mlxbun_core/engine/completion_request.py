"""An OpenAI ``/v1/completions`` body, in the legacy shapes evaluation tools send.

lm-evaluation-harness (``local-completions``) and other scorers use the old API: ``prompt``
as a string, an array of strings, an array of token ids or an array of token-id arrays
(each prompt its own choices, ``n`` each, in prompt order); ``logprobs`` as an integer
top-k (0..20), where mlx-lm takes a boolean (both are read); ``echo`` to get the prompt
back in front of the text, scored token by token when log-probs are asked for; and
``max_tokens: 0`` with ``echo`` to score a prompt without generating.
"""

from __future__ import annotations

from typing import Any

from ..errors import BadRequest
from .request import CompletionRequest, Prompt, boolean_field, openai_options, shared_fields
from .sampling import described, type_error

LEGACY_TOP_MAX = 20  # OpenAI's legacy ``logprobs`` ceiling
MAX_PROMPT_CHOICES = 64  # prompts × n in one request (the engine's queue holds 64 waiting)
PROMPT_SHAPES = ("a non-empty string, an array of strings, an array of token ids or an "
                 "array of token-id arrays")


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def prompt_list(value: object) -> list[Prompt]:
    """``prompt`` in any of its four shapes as a list of prompts (text, or token ids)."""
    if isinstance(value, str):
        if not value:
            raise BadRequest(f"prompt must be {PROMPT_SHAPES} (got an empty string)",
                             param="prompt")
        return [value]
    if not isinstance(value, list) or not value:
        shown = "an empty array" if value == [] else described(value)
        raise BadRequest(f"prompt must be {PROMPT_SHAPES} (got {shown})", param="prompt")
    if all(_is_token_id(v) for v in value):
        return [list(value)]
    prompts: list[Prompt] = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            prompts.append(item)
        elif isinstance(item, list) and item and all(_is_token_id(t) for t in item):
            prompts.append(list(item))
        else:
            shown = ("an empty " + ("string" if item == "" else "array")
                     if item in ("", []) else described(item))
            raise BadRequest(f"prompt[{i}] must be a non-empty string or a non-empty array "
                             f"of non-negative token ids (got {shown})", param="prompt")
    return prompts


def legacy_top_k(body: dict[str, Any]) -> int | None:
    """``logprobs`` as OpenAI's legacy integer (the top-k to report), or None when it is
    mlx-lm's boolean or absent; 400 outside 0..20 or for another type."""
    value = body.get("logprobs")
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, int):
        raise type_error("logprobs", f"a boolean or an integer from 0 to {LEGACY_TOP_MAX}", value)
    if not 0 <= value <= LEGACY_TOP_MAX:
        raise BadRequest(f"logprobs must be between 0 and {LEGACY_TOP_MAX} (got {value})",
                         param="logprobs", code="invalid_value")
    return value


def zero_budget(body: dict[str, Any], echo: bool) -> str | None:
    """The field name when the body asks for no generated tokens (``max_tokens: 0``):
    allowed with ``echo`` only, where it scores the prompt alone."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value == 0 and isinstance(value, int) and not isinstance(value, bool):
            if not echo:
                raise BadRequest(f"{name} must be at least 1 (0 is allowed with echo: true, "
                                 "to score the prompt alone)", param=name)
            return name
        if value is not None:
            return None
    return None


def parse_completion(body: dict[str, Any], defaults: dict[str, Any] | None = None,
                     server_max_tokens: int | None = None) -> CompletionRequest:
    """An OpenAI /v1/completions body (see the module's note for the legacy shapes)."""
    prompts = prompt_list(body.get("prompt"))
    echo = boolean_field(body.get("echo"), "echo")
    top_k = legacy_top_k(body)
    zero = zero_budget(body, echo)
    shaped = dict(body)
    if top_k is not None:  # read as mlx-lm's fields: logprobs on, top-k set below
        shaped.update(logprobs=True, top_logprobs=None)
    if zero is not None:
        shaped[zero] = None
    options = openai_options(shaped, defaults or {}, server_max_tokens, "completions")
    if top_k:
        options.sampling.top_logprobs = top_k
    if zero is not None:
        options.max_tokens = 0
    if len(prompts) * options.n > MAX_PROMPT_CHOICES:
        raise BadRequest(f"{len(prompts)} prompts × n={options.n} is more than "
                         f"{MAX_PROMPT_CHOICES} choices in one request", param="prompt")
    return CompletionRequest(prompt=prompts[0], prompts=prompts, echo=echo,
                             **shared_fields(options))
