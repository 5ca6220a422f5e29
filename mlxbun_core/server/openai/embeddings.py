"""POST /v1/embeddings — the OpenAI embeddings surface.

Family-agnostic: validation and response shape live here; the vectors come from
whichever plugin's ``embed`` hook claims the served model (through
``Engine.embed``, under the model lease). A model no plugin embeds answers 400.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ...errors import BadRequest
from ..common import guarded, json_response, read_body

if TYPE_CHECKING:
    from ...engine.core import Engine
    from ..state import App

ENCODINGS = ("float", "base64")


def parse_input(body: dict[str, Any]) -> list[str]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        raise BadRequest("input must be a string or an array of strings", param="input")
    if not raw:
        raise BadRequest("input must not be empty", param="input")
    if not all(isinstance(t, str) for t in raw):
        raise BadRequest("input must be a string or an array of strings", param="input")
    return raw


def encode_vector(vec: Sequence[float], fmt: str) -> str | list[float]:
    if fmt == "base64":
        import numpy as np

        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vec]


def register(app: App, engine: Engine) -> None:
    model_id = engine.model.id

    @guarded()
    async def embeddings(request: Request) -> Response:
        body = await read_body(request)
        texts = parse_input(body)
        instruction = body.get("instruction")
        if instruction is not None and not isinstance(instruction, str):
            raise BadRequest("instruction must be a string", param="instruction")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ENCODINGS:
            raise BadRequest("encoding_format must be 'float' or 'base64'", param="encoding_format")
        vectors, prompt_tokens = await engine.embed(texts, instruction or None)
        data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, fmt)}
                for i, v in enumerate(vectors)]
        return json_response({"object": "list", "data": data, "model": model_id,
                              "usage": {"prompt_tokens": prompt_tokens,
                                        "total_tokens": prompt_tokens}})

    app.router.add_post("/v1/embeddings", embeddings)
