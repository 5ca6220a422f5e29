"""A lone request, decoded outside the batch until another one can join it.

mlx-lm's ``BatchGenerator`` costs a lone stream against mlx-lm's single-sequence
loop (batch caches, masks, per-row bookkeeping: 0.72-0.81x on an H200 at the 8B
shape), and a local server mostly serves one client at a time. So the batch lane
runs a lone job here, one prefill chunk (sized by the engine's pacer) or one token
per ``step``, with the same pipelined step as mlx-lm's ``generate_step`` (the next
token is queued before the current one is read), and moves it into the batch the
moment another job can join: ``handoff`` gives the token still to feed, and ``fed`` / ``cache`` say
what the KV holds. A batch that drains to one decoding row hands it back here
(``resume``).
"""

from __future__ import annotations

import copy
from typing import Optional

from ..job import GenerationJob
from ..prompt_cache import trimmable
from .pace import PrefillPacer


class Solo:
    def __init__(self, model, job: GenerationJob, cache: list, cached: int, pacer: PrefillPacer):
        self.model, self.job, self.cache = model, job, cache
        self.prompt = job.request.prompt_tokens
        self.fed = list(self.prompt[:cached])  # tokens whose forward pass was issued, in order
        self.pacer = pacer  # prompt tokens per prefill chunk
        self._next = None  # (token, logprobs) being computed: sampled, not yet fed
        self._context = None  # what the logits processors see: every token fed so far
        self._count = 0

    @classmethod
    def resume(cls, model, job: GenerationJob, cache: list, fed: list, pending,
               pacer: PrefillPacer):
        """A job leaving the batch: ``cache`` holds ``fed``; ``pending`` is the
        ``(token array, logprobs)`` sampled from it and not yet fed."""
        solo = cls(model, job, cache, 0, pacer)
        solo.fed, solo._next = list(fed), pending
        return solo

    @property
    def prefilling(self) -> bool:
        return self._next is None and len(self.fed) < len(self.prompt) - 1

    def boundary(self) -> Optional[list]:
        """A copy of the KV at the prompt boundary when the cache cannot rewind (to be
        published for the next turn); None when it can."""
        return None if trimmable(self.cache) else copy.deepcopy(self.cache)

    def step(self):
        """One prefill chunk (returns None) or one token: ``(token, logprobs)``."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        with mx.stream(generation_stream):
            if self._next is None:
                if self.prefilling:
                    start, size = len(self.fed), self.pacer.chunk()
                    chunk = self.prompt[start:min(start + size, len(self.prompt) - 1)]
                    with self.pacer.timed(size) as timer:
                        self.model(mx.array(chunk)[None], cache=self.cache)
                        mx.eval([c.state for c in self.cache])
                        timer.tokens = len(chunk)
                    self.fed += chunk
                    return None
                self._next = self._forward(mx.array(self.prompt[-1:]))
                self.fed.append(self.prompt[-1])
                mx.async_eval(*self._next)
            y, logprobs = self._next
            self._next = self._forward(y)  # queued before we wait on y: the device never idles
            mx.async_eval(*self._next)
            token = y.item()
        self.fed.append(token)
        self._count += 1
        if self._count % 256 == 0:
            mx.clear_cache()
        return token, logprobs

    def handoff(self):
        """``(pending, segments)`` for the batch: the sampled but unfed ``(token,
        logprobs)`` (None while the prompt is still being read) and the prompt
        segments still to feed (none once decoding)."""
        import mlx.core as mx

        if self._next is None:
            rest = self.prompt[len(self.fed):]
            return None, ([rest[:-1], rest[-1:]] if len(rest) > 1 else [rest])
        y, logprobs = self._next
        mx.eval(y, logprobs)
        return (y.item(), logprobs), []

    def _forward(self, y):
        """Feed ``y`` (shape (1,)); the sampled next token and its log-probabilities."""
        import mlx.core as mx

        req = self.job.request
        logits = self.model(y[None], cache=self.cache)[:, -1, :]
        if req.processors:
            if self._context is None:
                self._context = mx.concatenate([mx.array(self.fed), y]) if self.fed else y
            else:
                self._context = mx.concatenate([self._context, y])
            for processor in req.processors:
                logits = processor(self._context, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return req.sampler(logprobs), logprobs.squeeze(0)
