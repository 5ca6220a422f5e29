"""The served model's tokenizer over HTTP, in the shapes other servers' clients send.

- ``POST /tokenize`` (and ``/v1/tokenize``): vLLM's ``{"prompt", "add_special_tokens"}``
  (special tokens added unless told not to) or llama.cpp's ``{"content", "add_special",
  "with_pieces"}`` (not added unless asked). The answer carries both servers' fields:
  ``tokens`` (ids; ``{"id", "piece"}`` objects with ``with_pieces``), ``count``,
  ``max_model_len`` (the context this server admits), and ``token_strs`` with vLLM's
  ``return_token_strs``.
- ``POST /detokenize`` (and ``/v1/detokenize``): ``{"tokens": [ids]}`` → the text as
  vLLM's ``prompt`` and llama.cpp's ``content``.
- ``GET /tokenizer_info`` (and ``/v1/tokenizer_info``): vLLM's tokenizer facts, the ones
  lm-evaluation-harness reads before it falls back to downloading the tokenizer from the
  hub (``eos_token``, ``bos_token``, ``pad_token``, ``chat_template``, ...).

Token ids come from the tokenizer the engine encodes prompts with, so a client that
tokenizes here and sends ids to ``/v1/completions`` gets exactly its own tokens scored.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..engine.logprobs import pieces_for
from ..engine.prepare import encode_prompt, vocab_size
from ..engine.request import boolean_field
from ..engine.sampling import type_error
from ..errors import BadRequest
from .common import guarded, json_response, read_body

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App

TEXT_FIELDS = (("prompt", True), ("content", False))  # (field, add special tokens by default)


def text_to_tokenize(body: dict[str, Any]) -> tuple[str, bool]:
    """The text (vLLM's ``prompt`` or llama.cpp's ``content``) and whether special tokens
    are added (each spelling's own field and default)."""
    for name, default in TEXT_FIELDS:
        if name in body:
            text = body[name]
            if not isinstance(text, str):
                raise type_error(name, "a string", text)
            flag = "add_special_tokens" if "add_special_tokens" in body else "add_special"
            return text, boolean_field(body.get(flag), flag, default)
    raise BadRequest("send the text to tokenize as prompt (vLLM) or content (llama.cpp)",
                     param="prompt")


def token_ids(value: object, size: int, name: str = "tokens") -> list[int]:
    """An array of token ids inside the model's vocabulary."""
    if not isinstance(value, list):
        raise type_error(name, "an array of token ids", value)
    for i, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool):
            raise type_error(f"{name}[{i}]", "an integer token id", t, param=name)
        if not 0 <= t < size:
            raise BadRequest(f"{name}[{i}]: token id {t} is outside the vocabulary "
                             f"(0..{size - 1})", param=name, code="invalid_value")
    return value


def special_token(tokenizer: Any, name: str) -> str | None:
    value = getattr(tokenizer, name, None)
    return value if isinstance(value, str) else None


def tokenizer_info(engine: Engine) -> dict[str, Any]:
    """vLLM's ``/tokenizer_info`` fields for the served model's tokenizer."""
    tok = engine.model.tokenizer
    template = getattr(tok, "chat_template", None)
    bos = special_token(tok, "bos_token")
    adds_bos = bool(bos) and tok.encode("a")[:1] == tok.encode(bos, add_special_tokens=False)
    return {"tokenizer_class": tokenizer_class(engine.model.path),
            "eos_token": special_token(tok, "eos_token"), "bos_token": bos,
            "pad_token": special_token(tok, "pad_token"),
            "unk_token": special_token(tok, "unk_token"),
            "eos_token_ids": sorted(tok.eos_token_ids), "add_bos_token": adds_bos,
            "chat_template": template if isinstance(template, (str, dict)) else None,
            "model_max_length": engine.admission.enforced_context,
            "vocab_size": vocab_size(engine.model)}


def register(app: App, engine: Engine) -> None:
    if engine.model.kind != "generate":
        return
    tok = engine.model.tokenizer

    @guarded()
    async def tokenize(request: Request) -> Response:
        body = await read_body(request)
        text, special = text_to_tokenize(body)
        pieces = boolean_field(body.get("with_pieces"), "with_pieces")
        strs = boolean_field(body.get("return_token_strs"), "return_token_strs")
        ids = await asyncio.to_thread(encode_prompt, tok, text, special)
        table = pieces_for(tok)
        out: dict[str, Any] = {
            "tokens": [{"id": t, "piece": table.get(t)[0]} for t in ids] if pieces else ids,
            "count": len(ids), "max_model_len": engine.admission.enforced_context}
        if strs:
            out["token_strs"] = [table.get(t)[0] for t in ids]
        return json_response(out)

    @guarded()
    async def detokenize(request: Request) -> Response:
        body = await read_body(request)
        ids = token_ids(body.get("tokens"), vocab_size(engine.model))
        try:
            text = str(await asyncio.to_thread(tok.decode, ids))
        except Exception as exc:  # an id the output layer has but the tokenizer lacks
            raise BadRequest(f"tokens cannot be decoded: {exc}", param="tokens") from None
        return json_response({"prompt": text, "content": text})

    @guarded()
    async def info(request: Request) -> Response:
        return json_response(tokenizer_info(engine))

    for prefix in ("", "/v1"):
        app.router.add_post(f"{prefix}/tokenize", tokenize)
        app.router.add_post(f"{prefix}/detokenize", detokenize)
        app.router.add_get(f"{prefix}/tokenizer_info", info)


def tokenizer_class(path: Any) -> str:
    """The HF tokenizer class the checkpoint names (its ``tokenizer_config.json``), else
    the fast tokenizer every mlx-lm model loads."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(path) / "tokenizer_config.json").read_text())
    except (OSError, ValueError, TypeError):
        config = {}
    named = config.get("tokenizer_class") if isinstance(config, dict) else None
    return named if isinstance(named, str) and named else "PreTrainedTokenizerFast"
