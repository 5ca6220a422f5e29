"""POST /v1/rerank (also /v2/rerank and /rerank): Cohere's and Jina's rerank surface.

One body serves both clients: ``query``, ``documents`` (strings, or objects with a
``text`` field), ``top_n``, ``return_documents``, Cohere's ``max_tokens_per_doc``
and, like /v1/embeddings, an optional ``instruction`` for the model. The answer
carries ``results`` (most relevant first: ``index``, ``relevance_score`` in [0, 1],
``document``), Jina's ``usage`` and Cohere's ``meta``. Family-agnostic: the scores
come from the served model's ``rerank`` hook through ``Engine.rerank``; a model no
plugin reranks answers 400 before any model work. Errors use OpenAI's shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..errors import BadRequest
from .common import guarded, json_response, new_id, read_body

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App

ROUTES = ("/v1/rerank", "/v2/rerank", "/rerank")
MAX_DOCUMENTS = 1000


def parse_query(body: dict[str, Any]) -> str:
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise BadRequest("query must be a non-empty string", param="query")
    return query


def parse_documents(body: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """The texts to score, and each document as the answer echoes it."""
    raw = body.get("documents")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("documents must be a non-empty array of strings or "
                         '{"text": ...} objects', param="documents")
    if len(raw) > MAX_DOCUMENTS:
        raise BadRequest(f"documents has {len(raw)} entries; at most {MAX_DOCUMENTS} per "
                         "request", param="documents")
    texts, echoed = [], []
    for i, doc in enumerate(raw):
        if isinstance(doc, str):
            texts.append(doc)
            echoed.append({"text": doc})
        elif isinstance(doc, dict) and isinstance(doc.get("text"), str):
            texts.append(doc["text"])
            echoed.append(doc)
        else:
            raise BadRequest(f"documents[{i}] must be a string or an object with a string "
                             '"text" field', param="documents")
    return texts, echoed


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{name} must be an integer of at least 1", param=name)
    return value


def parse_flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false", param=name)
    return value


def parse_instruction(body: dict[str, Any]) -> str | None:
    value = body.get("instruction")
    if value is not None and not isinstance(value, str):
        raise BadRequest("instruction must be a string", param="instruction")
    return value or None


def ranked(scores: list[float], echoed: list[Any], top_n: int | None,
           with_documents: bool) -> list[dict[str, Any]]:
    """Results, most relevant first (equal scores keep the documents' order)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    rows: list[dict[str, Any]] = []
    for i in order:
        row: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if with_documents:
            row["document"] = echoed[i]
        rows.append(row)
    return rows


def register(app: App, engine: Engine) -> None:
    model_id = engine.model.id

    @guarded()
    async def rerank(request: Request) -> Response:
        body = await read_body(request)
        query = parse_query(body)
        texts, echoed = parse_documents(body)
        top_n = positive_int(body, "top_n")
        max_doc_tokens = positive_int(body, "max_tokens_per_doc")
        with_documents = parse_flag(body, "return_documents", True)
        scores, used = await engine.rerank(query, texts, parse_instruction(body),
                                           max_doc_tokens)
        version = "2" if request.path.startswith("/v2/") else "1"
        return json_response({
            "id": new_id("rerank-"), "model": model_id,
            "results": ranked(scores, echoed, top_n, with_documents),
            "usage": {"prompt_tokens": used, "total_tokens": used},
            "meta": {"api_version": {"version": version},
                     "tokens": {"input_tokens": used, "output_tokens": 0}}})

    for path in ROUTES:
        app.router.add_post(path, rerank)
