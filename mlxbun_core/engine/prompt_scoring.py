"""A prompt's own log-probabilities, read off the prefill (completions' ``echo`` with
``logprobs``: how evaluation tools score a continuation).

The serial lane reads a scored prompt through :meth:`PromptScorer.read` instead of its
plain prefill: each paced chunk runs the model once into the KV cache, as any prefill
chunk does, but keeps every position's logits instead of only the last. Position ``i``'s
distribution scores token ``i + 1``; the first token has nothing before it (its
``logprob`` is None, OpenAI's null). The values are the model's own distribution
(log-softmax in float32 of the raw logits: no logit bias, penalty or temperature, which
shape sampling, not the prompt), so they equal mlx-lm's forward pass of the same tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..contract import Tokenizer
from .logprobs import LogprobRecorder

if TYPE_CHECKING:
    import mlx.core as mx

SLICE = 256  # positions turned into float32 log-probs at once: bounds the scratch to SLICE × vocab


class PromptScorer:
    """Scores ``prompt`` chunk by chunk while filling ``cache``; ``entries`` grows with
    one per-token entry (``LogprobRecorder``'s shape, ``top_k`` alternatives each)."""

    def __init__(self, model: Any, cache: list[Any], tokenizer: Tokenizer, prompt: list[int],
                 top_k: int):
        self.model, self.cache = model, cache
        self.recorder = LogprobRecorder(tokenizer, top_k)
        self.entries: list[dict[str, Any]] = [self.recorder.ranked(prompt[0], None, [], [])]

    def read(self, chunk: list[int], next_token: int) -> None:
        """One prefill chunk: the forward pass into the cache, then the log-probs of the
        tokens it predicts (the chunk's own after its first, and ``next_token``)."""
        import mlx.core as mx

        logits = self.model(mx.array(chunk)[None], cache=self.cache)[0]
        mx.eval(logits, [c.state for c in self.cache])
        targets = [*chunk[1:], next_token]
        for start in range(0, len(targets), SLICE):
            self._score(logits[start:start + SLICE], targets[start:start + SLICE])

    def _score(self, logits: mx.array, targets: list[int]) -> None:
        import mlx.core as mx

        lp = logits.astype(mx.float32)
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(lp, mx.array(targets)[:, None], axis=-1)[:, 0]
        k = min(self.recorder.k, lp.shape[-1])
        if k:
            top = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
            top_values = mx.take_along_axis(lp, top, axis=-1)
            mx.eval(chosen, top, top_values)
            ids = cast("list[list[int]]", top.tolist())
            values = cast("list[list[float]]", top_values.tolist())
        else:
            mx.eval(chosen)
            ids, values = [[] for _ in targets], [[] for _ in targets]
        for token, value, row_ids, row_values in zip(
                targets, cast("list[float]", chosen.tolist()), ids, values):
            self.entries.append(self.recorder.ranked(token, value, row_ids, row_values))
