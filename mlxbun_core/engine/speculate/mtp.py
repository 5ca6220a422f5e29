"""Speculation with the model's own multi-token-prediction head (``--draft-kind mtp``).

The drafter is a :class:`~mlxbun_core.contract.TokenPredictor` from the plugin that
claimed the model. Each round:

1. the head turns the target's hidden states of the last round's kept positions (paired
   with the tokens that followed them) into its first draft, then chains ``n - 1`` more
   on its own output; the chained rows leave its cache again at once;
2. the target runs one forward over ``[x, d1..dn]`` (``x`` the token sampled last) and
   samples every position with the request's sampler and processors;
3. drafts are accepted while they equal the target's samples (exact token match: the
   emitted tokens are always the target's own samples, so greedy output is the plain
   decode's and a sampled one keeps the target's distribution);
4. rejected positions leave the target's cache: trimmed where every layer can trim;
   otherwise (recurrent layers, as in Qwen3.5's gated-DeltaNet) the state from before
   the round is put back and the kept tokens are fed again, queued ahead of the next
   round (lazily: no extra wait).

The drafts and the verify forward are one lazy graph: a round waits on the device once.
The head's cache is filled while the prompt is read (:meth:`MtpStream.read`); positions
a prefix-cache hit skipped have no hidden state, so its rows start after them (drafts
still verify; they only see less context).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .stream import Emitted, SpecTally, count_round, process_window

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import LogitsProcessor, Sampler, TokenPredictor


MAX_REFEED = 32
"""Kept tokens carried into the next window after rollbacks before they get a forward
of their own (each rollback of a window re-feeds what it carried)."""


@dataclass
class HeadState:
    """An MTP request's head moving between the lone stream and the batch: the head's
    ``cache`` (mlx-lm caches), the target's ``hidden`` states ``(1, k, H)`` it has not
    read yet (None: none), the tokens ``after`` the first ``k - 1`` of them (the last
    one's is the request's next input), and the tokens the target's cache still lacks
    (``refeed``: kept tokens a recurrent rollback took out, fed ahead of the next input)."""

    cache: list[Any]
    hidden: mx.array | None = None
    after: list[int] = field(default_factory=list)
    refeed: list[int] = field(default_factory=list)


class MtpStream:
    """One request's MTP speculation over the target ``cache`` (which holds ``fed``)."""

    def __init__(self, predictor: TokenPredictor, cache: list[Any], fed: list[int], n: int,
                 sampler: Sampler, processors: list[LogitsProcessor],
                 usage: dict[str, int], tally: SpecTally | None = None):
        self.predictor, self.cache, self.fed = predictor, cache, fed
        self.n = n
        self.sampler, self.processors = sampler, processors
        self.usage, self.tally = usage, tally
        self.head_cache = predictor.make_cache()
        self.trimmable = all(c.is_trimmable() for c in cache)
        # target states whose next token is known, not yet given to the head: (1, L, H)
        self.hidden: mx.array | None = None
        self._window: tuple[mx.array, mx.array, mx.array, mx.array | None] | None = None
        self._snapshot: list[Any] | None = None
        self._snapshot_refeed = 0  # refed tokens the window in flight starts with
        self._refeed: list[int] = []  # accepted tokens a rollback took out, to feed again
        self._carry: list[Emitted] = []  # a token to hand out with the next step (resume)

    @property
    def running(self) -> bool:
        return self._window is not None

    def read(self, tokens: list[int], after: int) -> None:
        """Feed prompt ``tokens`` (a prefill chunk) to the target, and their states,
        each paired with the prompt token after it (``after`` follows the chunk), to
        the head."""
        import mlx.core as mx

        _, hidden = self.predictor.forward(mx.array(tokens)[None], self.cache)
        self.fed.extend(tokens)
        self.predictor.predict(hidden, mx.array(tokens[1:] + [after])[None], self.head_cache)
        mx.eval([c.state for c in self.cache + self.head_cache])

    def begin(self, token: int) -> None:
        """Start decoding: ``token`` (the prompt's last) is fed as a plain first window
        (no hidden state to draft from yet)."""
        self._launch(token, None)

    def resume(self, token: int, emit: Emitted, head: HeadState) -> None:
        """Go on from a batch row: ``token`` was sampled and not fed (``emit``: handed out
        with the next step); ``head``: the row's head, its pending states followed by
        ``head.after`` and then ``token``, and the tokens to feed ahead of ``token``."""
        self._carry = [emit]
        self.head_cache = head.cache
        self.hidden, self._refeed = head.hidden, list(head.refeed)
        after = head.after
        self._launch(token, mx_tokens([*after, token]) if head.hidden is not None else None)

    def step(self) -> list[Emitted]:
        """Read the round in flight, settle the caches, queue the next; the tokens it
        produced, in order."""
        out, kept = self._read()
        self._launch(kept[-1], mx_tokens(kept))
        return out

    def handoff(self) -> tuple[list[Emitted], int, HeadState]:
        """Stop without queueing another round (the cache then holds ``fed``): the tokens
        the round in flight produced, the next input (its last token, not fed), and the
        head's state (with the tokens the cache still lacks, fed ahead of that input)."""
        out, kept = self._read()
        self._window = None
        refeed, self._refeed = self._refeed, []
        hidden, self.hidden = self.hidden, None
        return out, kept[-1], HeadState(self.head_cache, hidden, kept[:-1], refeed)

    def _read(self) -> tuple[list[Emitted], list[int]]:
        """Read the round in flight and settle the caches: its tokens (after any carried
        one), and the kept ones (the accepted drafts and the target's last sample)."""
        assert self._window is not None  # begun
        hidden, samples_arr, logprobs, drafts_arr = self._window
        samples = _ints(samples_arr)
        drafts = _ints(drafts_arr) if drafts_arr is not None else []
        accepted = 0
        while accepted < len(drafts) and samples[accepted] == drafts[accepted]:
            accepted += 1
        if drafts:
            self._count(len(drafts), accepted)
        kept = drafts[:accepted] + [samples[accepted]]
        if accepted < len(drafts):
            self._rollback(len(drafts), drafts[:accepted])
        else:
            self.fed.extend(kept[:-1])
        # states at the kept positions; each is followed by the next kept token
        self.hidden = hidden[:, :accepted + 1]
        carry, self._carry = self._carry, []
        return carry + [(t, logprobs[i]) for i, t in enumerate(kept)], kept

    def settle(self) -> None:
        """Stop: drop the drafts in flight from a trimmable cache (a recurrent one is left
        as it is: the caller must not reuse it)."""
        window, self._window = self._window, None
        if window is not None and window[3] is not None and self.trimmable:
            from mlx_lm.models.cache import trim_prompt_cache

            trim_prompt_cache(self.cache, int(window[3].shape[0]))

    # -- internals -------------------------------------------------------------------
    def _draft(self, after: mx.array) -> mx.array | None:
        """``n`` drafts from the head: the first from the pending states paired with the
        tokens ``after`` them, the rest chained on the head's own output."""
        import mlx.core as mx

        if self.hidden is None or self.n < 1:
            return None
        logits, state = self.predictor.predict(self.hidden, after[None], self.head_cache)
        self.hidden = None
        drafts = [self._sample_draft(logits)]
        for _ in range(self.n - 1):
            logits, state = self.predictor.predict(state[:, -1:], drafts[-1][None],
                                                   self.head_cache)
            drafts.append(self._sample_draft(logits))
        if self.n > 1:  # chained rows rest on drafts: the next round rebuilds them
            from mlx_lm.models.cache import trim_prompt_cache

            trim_prompt_cache(self.head_cache, self.n - 1)
        return mx.concatenate(drafts)

    def _sample_draft(self, logits: mx.array) -> mx.array:
        import mlx.core as mx

        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampler(logprobs).astype(mx.uint32).reshape(1)

    def _launch(self, token: int, after: mx.array | None) -> None:
        """Queue the head's drafts and the target's forward over the refed tokens (after a
        recurrent rollback), ``token`` and the drafts."""
        import mlx.core as mx

        drafts = self._draft(after) if after is not None else None
        if len(self._refeed) > MAX_REFEED:  # consecutive rollbacks: feed them on their own
            self.predictor.forward(mx_tokens(self._refeed)[None], self.cache)
            self.fed.extend(self._refeed)
            self._refeed = []
        head = self._refeed + [token]
        inputs = mx_tokens(head)
        if drafts is not None:
            inputs = mx.concatenate([inputs, drafts])
        self._snapshot = None
        if drafts is not None and not self.trimmable:
            self._snapshot = _snapshot(self.cache)
            self._snapshot_refeed = len(self._refeed)
        done = len(self.fed)
        logits, hidden = self.predictor.forward(inputs[None], self.cache)
        skip = len(self._refeed)
        logits, hidden = logits[0, skip:], hidden[:, skip:]
        self.fed.extend(self._refeed)
        self._refeed = []
        if self.processors:
            logits = process_window(self.processors, logits, self.fed, inputs[skip:], done + skip)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samples = self.sampler(logprobs)
        mx.async_eval(samples, logprobs, hidden, *([] if drafts is None else [drafts]))
        self.fed.append(token)
        self._window = (hidden, samples, logprobs, drafts)
        self.usage["targetCalls"] += 1
        if self.tally is not None:
            self.tally.target_calls += 1

    def _rollback(self, drafted: int, kept: list[int]) -> None:
        """Take the rejected drafts back out of the target's cache (``kept``: the drafts
        accepted)."""
        from mlx_lm.models.cache import trim_prompt_cache

        if self.trimmable:
            trim_prompt_cache(self.cache, drafted - len(kept))
            self.fed.extend(kept)
            return
        # recurrent layers cannot trim: put back the state from before the window and
        # feed its kept tokens again, ahead of the next window
        assert self._snapshot is not None
        refed, window = self._snapshot_refeed, self._snapshot_refeed + 1 + drafted
        _restore(self.cache, self._snapshot, window)
        self._refeed = self.fed[len(self.fed) - refed - 1:] + kept
        del self.fed[len(self.fed) - refed - 1:]

    def _count(self, drafted: int, accepted: int) -> None:
        count_round(self.usage, self.tally, drafted, accepted)


def mx_tokens(tokens: list[int]) -> mx.array:
    import mlx.core as mx

    return mx.array(tokens, dtype=mx.uint32)


def _ints(tokens: mx.array) -> list[int]:
    out: list[int] = tokens.reshape(-1).tolist()  # type: ignore[assignment]  # ints
    return out


def _snapshot(cache: list[Any]) -> list[Any]:
    """What a round may change in layers that cannot trim (arrays are immutable: holding
    the references is the copy)."""
    return [None if c.is_trimmable() else list(c.cache) for c in cache]


def _restore(cache: list[Any], snapshot: list[Any], window: int) -> None:
    from mlx_lm.models.cache import trim_prompt_cache

    for c, saved in zip(cache, snapshot, strict=True):
        if saved is None:
            trim_prompt_cache([c], window)
        else:
            c.cache = list(saved)
