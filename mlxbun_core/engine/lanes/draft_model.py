"""A mounted draft model's speculative decoding (``--draft-model``), as the serial lane
runs it: both models read the prompt in paced chunks (so cancellation lands between
them), then mlx-lm's ``speculative_generate_step`` gets the last prompt token and the
filled caches. The prefix cache is bypassed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from ... import kvquant
from ...contract import DraftSource
from ..job import GenerationJob
from .pace import PrefillPacer

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn


def draft_model_steps(model: nn.Module, job: GenerationJob, source: DraftSource,
                      kv: kvquant.KVScheme, pacer: PrefillPacer
                      ) -> Iterator[tuple[int, mx.array] | None]:
    """``job``'s steps: None for a prefill chunk, else a token and its log-probs."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    from ... import cache_ops

    req, usage = job.request, job.session.usage
    usage.lane = "serial+spec"
    spec = usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
    n = source.num_draft_tokens
    prompt, draft = req.prompt_tokens, kvquant.quantizing(source.model, kv)
    target_cache, draft_cache = cache_ops.make(model), cache_ops.make(draft)
    start = 0
    if len(target_cache) == len(getattr(model, "layers", ())):  # how mlx-lm splits
        end, t0 = len(prompt) - 1, time.perf_counter()
        while start < end:
            size = pacer.chunk()
            stop = min(start + size, end)
            with pacer.timed(size) as timer:
                chunk = mx.array(prompt[start:stop])[None]
                draft(chunk, cache=draft_cache)
                model(chunk, cache=target_cache)
                mx.eval([c.state for c in target_cache + draft_cache])
                timer.tokens = stop - start
            start = stop
            yield None
        job.session.phases["prefill_s"] = time.perf_counter() - t0
    # mlx-lm annotates pairs of arrays; it yields (token id, log-probs, from the draft)
    steps = cast("Iterator[tuple[int, mx.array, bool]]", speculative_generate_step(
        mx.array(prompt[start:]), model, draft, num_draft_tokens=n,
        max_tokens=job.limit or (1 << 30), sampler=req.sampler,
        logits_processors=req.processors or None,
        prompt_cache=target_cache + draft_cache))
    for token, logprobs, from_draft in steps:
        if from_draft:
            spec["accepted"] += 1
        else:  # every verify round ends with one token of the target's own
            spec["targetCalls"] += 1
            spec["drafted"] += n
        yield token, logprobs
