"""Speculative decoding with a small draft model (``mlxbun serve --draft-model PATH``).

Answers the ``draft_source`` hook last, so a family plugin with its own proposer
(multi-token-prediction heads, n-gram lookup) takes precedence.
"""

from __future__ import annotations

import logging

from mlxbun_core.hookspecs import hookimpl
from mlxbun_core.model import DraftModel

log = logging.getLogger("mlxbun.draft")


@hookimpl(trylast=True)
def draft_source(model, options):
    path = options.extra.get("draft_model")
    if not path:
        return None
    from mlx_lm.utils import load

    from mlxbun_core.models.resolve import resolve_model

    resolved = resolve_model(path, library=options.library)  # the operator's library
    draft, tokenizer = load(str(resolved.path))
    if tokenizer.vocab_size != model.tokenizer.vocab_size:
        raise ValueError(f"draft model {resolved.model_id} has a different vocabulary "
                         f"({tokenizer.vocab_size} vs {model.tokenizer.vocab_size} tokens)")
    n = int(options.extra.get("num_draft_tokens") or 3)
    log.info("speculative decoding: draft %s, %d tokens per step", resolved.model_id, n)
    return DraftModel(model=draft, num_draft_tokens=n, name=resolved.model_id)
