"""Reranking on the worker: a request's documents in calls of ``RERANK_CALL``.

Each call scores its documents through the family's ``rerank`` hook on the worker
thread; the lanes step between calls, so a long rerank never holds up streaming
generations for its whole length.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from ..errors import BadRequest

if TYPE_CHECKING:
    from ..model import LoadedModel
    from ..plugins import ModelHooks
    from .worker import ModelWorker

log = logging.getLogger("mlxbun.engine")

RERANK_CALL = 32  # documents per worker call


async def rerank(worker: ModelWorker, hooks: ModelHooks, model: LoadedModel, query: str,
                 documents: list[str], instruction: str | None,
                 max_doc_tokens: int | None) -> tuple[list[float], int]:
    """Scores for ``documents`` in order, and the prompt tokens the model read."""
    started = time.monotonic()
    scores: list[float] = []
    used = 0
    for at in range(0, len(documents), RERANK_CALL):
        part = documents[at:at + RERANK_CALL]
        result: tuple[list[float], int] | None = await worker.call(partial(
            hooks.rerank, model=model, query=query, documents=part, instruction=instruction,
            max_doc_tokens=max_doc_tokens))
        if result is None:
            raise BadRequest(f"model {model.id} cannot rerank", param="model")
        if len(result[0]) != len(part):
            raise RuntimeError(f"the rerank hook gave {len(result[0])} scores "
                               f"for {len(part)} documents")
        scores += result[0]
        used += result[1]
    log.info("rerank · %d documents · %d tok · %.0f ms", len(documents), used,
             1e3 * (time.monotonic() - started))
    return scores, used
