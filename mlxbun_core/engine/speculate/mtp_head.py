"""The MTP rows' heads, batched: one head cache for every MTP row of the batch lane, and
a step's drafts for all of them in ``n + 1`` head calls at most (not one call per row and
draft).

A row's head reads its prompt on its own cache (``MtpBatch.read``); the first time it
drafts, that cache joins the batch's (mlx-lm's ``BatchKVCache``: merged, left-padded).
Rows that leave are filtered out. A step appends to every row at once, so rows that
append fewer positions are right-padded (``prepare``/``finalize`` roll the padding into
the row's left padding, where the mask hides it for good: what mlx-lm's batched prefill
does):

1. the pending states but each row's last, with the tokens after them (skipped when no
   row has more than one);
2. each row's last state with its pending token (a row with nothing pending is all
   padding): the predictor's logits are the last column's, every row's first draft;
3. ``n - 1`` chained calls, one position each; those leave the cache again at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import Sampler, TokenPredictor


class HeadBatch:
    """The heads' batched cache (``uids``: its rows, in order)."""

    def __init__(self, predictor: TokenPredictor):
        self.predictor = predictor
        self.cache: list[Any] | None = None
        self.uids: list[int] = []

    def sync(self, want: list[int], own: dict[int, list[Any]]) -> None:
        """Hold exactly the rows ``want``: drop the others, merge in new rows' own caches
        (``own[uid]``, read from their prompts)."""
        from mlx_lm.models.cache import BatchKVCache

        if self.uids == want:
            return
        wanted = set(want)
        keep = [i for i, uid in enumerate(self.uids) if uid in wanted]
        if self.cache is not None and len(keep) < len(self.uids):
            if keep:
                for c in self.cache:
                    c.filter(keep)
            else:
                self.cache = None
        kept = [self.uids[i] for i in keep]
        new = [uid for uid in want if uid not in set(kept)]
        if new:
            layers = len(own[new[0]])
            merged = [BatchKVCache.merge([own[uid][i] for uid in new]) for i in range(layers)]
            if self.cache is None:
                self.cache = merged
            else:
                for c, m in zip(self.cache, merged, strict=True):
                    c.extend(m)
        self.uids = kept + new

    def extract(self, uid: int) -> list[Any] | None:
        """Row ``uid``'s head cache on its own (None: it is not batched here)."""
        if self.cache is None or uid not in self.uids:
            return None
        i = self.uids.index(uid)
        return [c.extract(i) for c in self.cache]

    def draft(self, states: list[mx.array | None], after: list[list[int]],
              pending: list[mx.array], depth: int, samplers: list[Sampler]) -> mx.array:
        """Append every row's pending ``states`` (``(1, k, H)``, None: nothing pending)
        paired with the tokens after them (``after``: the first ``k - 1``; the last is
        the row's ``pending`` token, ``(1,)``), and chain ``depth`` drafts per row:
        ``(rows, depth)`` (rows with nothing pending draft garbage: ignore them)."""
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

        assert self.cache is not None
        hidden_size = next(s for s in states if s is not None).shape[-1]
        dtype = next(s for s in states if s is not None).dtype
        heads = [s.shape[1] - 1 if s is not None else 0 for s in states]
        if max(heads) > 0:  # 1. every pending state but the last
            width = max(heads)
            grid = [_padded(s[:, :-1] if s is not None else None, width, hidden_size, dtype)
                    for s in states]
            tokens = [a + [0] * (width - len(a)) for a in after]
            self._append(mx.concatenate(grid), mx.array(tokens, dtype=mx.uint32),
                         [width - h for h in heads])
        last = mx.concatenate([_padded(s[:, -1:] if s is not None else None, 1, hidden_size,
                                       dtype) for s in states])
        tokens_last = mx.concatenate([p.reshape(1) for p in pending]).astype(mx.uint32)
        logits, state = self._append(last, tokens_last[:, None],
                                     [0 if s is not None else 1 for s in states])
        drafts = [_sample(samplers, logits)]  # 2. the first draft of every row
        for _ in range(depth - 1):  # 3. chained on the head's own output
            logits, state = self.predictor.predict(state[:, -1:], drafts[-1][:, None],
                                                   self.cache)
            drafts.append(_sample(samplers, logits))
        if depth > 1:  # chained rows rest on drafts: the next step rebuilds them
            trim_prompt_cache(self.cache, depth - 1)
        return mx.stack(drafts, axis=1)

    def _append(self, hidden: mx.array, tokens: mx.array,
                right_padding: list[int]) -> tuple[mx.array, mx.array]:
        assert self.cache is not None
        padded = max(right_padding) > 0
        if padded:
            for c in self.cache:
                c.prepare(right_padding=right_padding)
        out = self.predictor.predict(hidden, tokens, self.cache)
        if padded:
            for c in self.cache:
                c.finalize()
        return out


def _padded(states: mx.array | None, width: int, hidden_size: int,
            dtype: mx.Dtype) -> mx.array:
    """``(1, width, H)``: ``states`` then zeros."""
    import mlx.core as mx

    have = 0 if states is None else int(states.shape[1])
    if states is not None and have == width:
        return states
    pad = mx.zeros((1, width - have, hidden_size), dtype=dtype)
    return pad if states is None else mx.concatenate([states, pad], axis=1)


def _sample(samplers: list[Sampler], logits: mx.array) -> mx.array:
    """Each row's draft with its own sampler (one call when they share one)."""
    import mlx.core as mx

    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if all(s is samplers[0] for s in samplers):
        out: mx.array = samplers[0](logprobs)
    else:
        out = mx.concatenate([s(logprobs[r:r + 1]) for r, s in enumerate(samplers)])
    return out.astype(mx.uint32).reshape(-1)
