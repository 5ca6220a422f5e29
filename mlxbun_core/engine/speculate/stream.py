"""Prompt-lookup speculation for one decoding stream (the lone-stream and serial paths).

Every forward pass is a *window* ``[x, d1..dk]``: ``x`` the token sampled last (fed now),
``d`` drafts copied from the history by :class:`~.lookup.PromptLookup` (``k`` may be 0).
The target samples every position with the request's own sampler and processors;
draft ``d(i+1)`` is accepted while it equals the sample at position ``i``, the first
mismatch (or the position after the last draft) gives the next token. Emitted tokens
are therefore always the target's own samples: greedy output is the plain decode's, and
a sampled one keeps the target distribution (a lookup draft is a point mass, for which
exact-match acceptance IS standard speculative rejection sampling: accept with
probability ``p(d)``, else draw from ``p`` without ``d``). Rejected positions are trimmed
from the KV cache (mlx-lm cache ``trim``).

Plain windows (``k == 0``) keep mlx-lm's pipelining: the next one is queued before the
current token is read. A window with drafts needs its samples read before the next can be
queued (the cache trim depends on them), so drafts are only sent when they are likely to
land: right after a round that accepted something, or when the lookup's first token matched
what was actually sampled on the last ``HIT_STREAK`` plain steps (a free check made on every
plain step; ``gate.py``, shared by every drafter). On text with nothing to look up, the
stream therefore decodes plainly, pipelined, almost always.

Invariant between steps: ``inflight`` is queued; its input token is already in ``fed``
(and was emitted); the cache holds ``fed`` plus the in-flight drafts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from .config import SpecConfig
from .gate import LandingGate
from .lookup import PromptLookup

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import LogitsProcessor, Sampler
    from ...grammar.base import GrammarProcessor

Emitted = tuple[int, "mx.array"]
"""A token and its log-probabilities (what a lane delivers)."""


class SpecTally:
    """Engine-wide counters (``/stats``, ``/metrics``): plain integers bumped per round."""

    __slots__ = ("requests", "drafted", "accepted", "rounds", "target_calls", "batch_steps")

    def __init__(self) -> None:
        self.requests = self.drafted = self.accepted = self.rounds = self.target_calls = 0
        self.batch_steps = 0  # batch-lane steps that verified drafts (for several rows)

    def describe(self) -> dict[str, Any]:
        rate = self.accepted / self.drafted if self.drafted else None
        return {"requests": self.requests, "drafted": self.drafted, "accepted": self.accepted,
                "rounds": self.rounds, "target_calls": self.target_calls,
                "batch_steps": self.batch_steps,
                "acceptance": None if rate is None else round(rate, 4)}


@dataclass
class _Window:
    drafts: list[int]
    samples: mx.array  # (k+1,) the target's sample at every position
    logprobs: mx.array  # (k+1, V)


class SpecStream:
    """One request's speculative decode over ``cache`` (which holds ``fed``)."""

    def __init__(self, model: Any, cache: list[Any], fed: list[int], config: SpecConfig,
                 sampler: Sampler, processors: list[LogitsProcessor], usage: dict[str, int],
                 tally: SpecTally | None = None):
        self.model, self.cache, self.fed = model, cache, fed
        self.n = config.num_draft_tokens
        self.sampler, self.processors = sampler, processors
        self.usage, self.tally = usage, tally
        self.lookup = PromptLookup(fed, config.ngram_max, config.ngram_min)
        self.proposal: list[int] = []  # what followed the last fed token, last time it occurred
        self.gate = LandingGate()  # drafts are landing: send them with the next window
        self.inflight: _Window | None = None
        self._carry: list[Emitted] = []  # a token to hand out with the next step
        # a grammar's mask processor: drafts are checked against it before they ride,
        # and the ones the target rejects are taken back from it
        self.grammar = grammar_of(processors)

    @property
    def running(self) -> bool:
        return self.inflight is not None

    def begin(self, token: int, emit: Emitted | None = None) -> None:
        """Feed ``token`` (the prompt's last, or a pending one; ``emit``: hand it out with
        the next step) as the first window."""
        self._feed([token])
        if emit is not None:
            self._carry.append(emit)
        self.proposal = self.lookup.propose(self.n + 1)
        self.inflight = self._launch(self._token_array([token]), [])

    def step(self) -> list[Emitted]:
        """Read the in-flight window, queue the next; the tokens it produced, in order."""
        window = self.inflight
        assert window is not None  # begun
        out, self._carry = self._carry, []
        if window.drafts:
            return out + self._verify(window)
        # plain: queue the next window before reading this one's token (pipelining)
        guess = self.proposal
        drafts = guess[1:self.n + 1] if self.gate.hot and len(guess) > 1 else []
        self.inflight = self._launch(window.samples, drafts, fed=False)
        token = _ints(window.samples)[0]
        self.gate.checked(bool(guess) and guess[0] == token)  # the last lookup's free check
        self._feed([token])
        self.proposal = self.lookup.propose(self.n + 1)
        out.append((token, window.logprobs[0]))
        return out

    def settle(self) -> tuple[mx.array, mx.array]:
        """Stop speculating: drop the in-flight drafts from the cache; ``(token array,
        logprobs)`` sampled after the last fed token, not yet fed (the lone stream's
        ``pending``)."""
        window = self.inflight
        assert window is not None and not self._carry
        self.inflight = None
        if window.drafts:
            _trim(self.cache, len(window.drafts))
            if self.grammar is not None:
                self.grammar.rollback(len(window.drafts))
        return window.samples[:1], window.logprobs[0]

    # -- internals -------------------------------------------------------------------
    def _verify(self, window: _Window) -> list[Emitted]:
        samples = _ints(window.samples)
        drafts = window.drafts
        accepted = 0
        while accepted < len(drafts) and samples[accepted] == drafts[accepted]:
            accepted += 1
        if accepted < len(drafts):
            _trim(self.cache, len(drafts) - accepted)
            if self.grammar is not None:
                self.grammar.rollback(len(drafts) - accepted)
        self._count(len(drafts), accepted)
        token = samples[accepted]  # the correction, or the bonus after a full accept
        kept = drafts[:accepted] + [token]
        self._feed(kept)
        self.gate.landed(accepted)
        # what followed ``token`` before: drafts now when they are landing, else the
        # first of them is checked against the next sample for free
        self.proposal = self.lookup.propose(self.n + 1)
        drafts_next = self.proposal[:self.n] if self.gate.hot else []
        self.inflight = self._launch(self._token_array([token]), drafts_next)
        if self.grammar is not None and accepted:
            # ``done`` says "only EOS after the last token handed out"; it is read per
            # token, and this step hands out several: the next window then samples EOS
            self.grammar.done = False
        return [(t, window.logprobs[i]) for i, t in enumerate(kept)]

    def _feed(self, tokens: list[int]) -> None:
        self.fed.extend(tokens)
        self.lookup.extend(tokens)

    def _token_array(self, tokens: list[int]) -> mx.array:
        import mlx.core as mx

        return mx.array(tokens, dtype=mx.uint32)

    def _launch(self, x: mx.array, drafts: list[int], fed: bool = True) -> _Window:
        """Queue the forward of ``[x, *drafts]`` and the samples of every position
        (without drafts where the cache could not take them back); ``fed``: ``x`` is
        already the last token of ``self.fed`` (else it follows it)."""
        import mlx.core as mx

        if drafts and not rewindable(self.cache, len(drafts) + 1):
            drafts = []
        if drafts and self.grammar is not None:  # the grammar's allowed prefix only
            context = self.fed if fed else [*self.fed, *_ints(x.reshape(1))]
            drafts = drafts[:self.grammar.draft_prefix(context, drafts)]

        inputs = x.reshape(1).astype(mx.uint32)
        if drafts:
            inputs = mx.concatenate([inputs, mx.array(drafts, dtype=mx.uint32)])
        logits = self.model(inputs[None], cache=self.cache)[0]  # (k+1, V)
        if self.processors:
            logits = process_window(self.processors, logits, self.fed, inputs,
                                    len(self.fed) - 1 if fed else len(self.fed))
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samples = self.sampler(logprobs)
        mx.async_eval(samples, logprobs)
        if self.usage is not None:
            self.usage["targetCalls"] += 1
        if self.tally is not None:
            self.tally.target_calls += 1
        return _Window(drafts, samples, logprobs)

    def _count(self, drafted: int, accepted: int) -> None:
        count_round(self.usage, self.tally, drafted, accepted)


def count_round(usage: dict[str, int], tally: SpecTally | None, drafted: int,
                accepted: int) -> None:
    """One verify round: the request's ``usage.speculation`` and the engine's tally."""
    usage["drafted"] += drafted
    usage["accepted"] += accepted
    if tally is not None:
        tally.drafted += drafted
        tally.accepted += accepted
        tally.rounds += 1


def process_window(processors: list[LogitsProcessor], logits: mx.array, fed: list[int],
                   inputs: mx.array, done: int, at: list[int] | None = None) -> mx.array:
    """The request's logits processors at every position of a window (or at the window
    positions ``at``, one per row of ``logits``), each seeing the tokens fed up to and
    including its own input (as the plain decode's would); ``done`` of ``fed`` precede
    the window's ``inputs``."""
    import mlx.core as mx

    head = mx.array(fed[:done], dtype=mx.uint32)
    context = mx.concatenate([head, inputs.astype(mx.uint32)])
    rows = []
    for k, i in enumerate(range(logits.shape[0]) if at is None else at):
        row = logits[k:k + 1]
        for processor in processors:
            row = processor(context[:done + i + 1], row)
        rows.append(row)
    return mx.concatenate(rows, axis=0)


def grammar_of(processors: list[LogitsProcessor]) -> GrammarProcessor | None:
    """The request's grammar mask processor, if it has one (it is always last)."""
    return cast("GrammarProcessor | None", next(
        (p for p in processors if hasattr(p, "draft_prefix")), None))


def _ints(tokens: mx.array) -> list[int]:
    """A 1-D token array read back to the host (the one sync of a step)."""
    return cast("list[int]", tokens.tolist())


def _trim(cache: list[Any], n: int) -> None:
    from ... import cache_ops

    cache_ops.trim(cache, n)


def rewindable(cache: list[Any], window: int) -> bool:
    """Whether every layer's cache can take back drafts after a ``window``-token forward:
    trimmable now, and a sliding-window (rotating) cache not wrapping meanwhile (once it
    has wrapped, it cannot rewind and the stream decodes plainly)."""
    for c in cache:
        if not c.is_trimmable():
            return False
        size = getattr(c, "max_size", None)
        if isinstance(size, int) and c.offset + window >= size:
            return False
    return True


def trim_to(cache: list[Any], tokens: int) -> None:
    """Trim ``cache`` to hold ``tokens`` positions (a stream that ended mid-burst fed
    more than it delivered)."""
    offset = getattr(cache[0], "offset", None) if cache else None
    if isinstance(offset, int) and offset > tokens:
        _trim(cache, offset - tokens)


class Stepper(Protocol):
    """A speculative stream as :func:`spec_steps` drives it (lookup or MTP)."""

    @property
    def running(self) -> bool: ...

    def begin(self, token: int) -> None: ...

    def step(self) -> list[Emitted]: ...

    def settle(self) -> Any: ...


def spec_steps(stream: Stepper, first: int) -> Iterator[Emitted]:
    """The stream as a token-at-a-time generator (the serial lane's decode loop); closing
    it drops the drafts still in flight."""
    stream.begin(first)
    try:
        while True:
            yield from stream.step()
    finally:
        if stream.running:
            stream.settle()
