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

Under a grammar (its mask processor among the request's), a round's window is a plan
walked along the matcher (``guided.walk``, the prompt-lookup guided stream's): each of
the head's guesses is sampled under the grammar's mask at its position (so a position
the grammar leaves one choice about gets that token), and a guess the matcher refuses
ends the draft; with forced-token fill on (``fill``) the tokens the grammar forces join
the window as kept tokens, as fill's runs. Only the drafts are verified (positions
masked as plain constrained decoding masks them); rejected ones leave the target's
cache and the matcher. Each guess is read on the host (the walk needs it): a round
under a grammar waits on the device once per guess.
Without a grammar the same gate (gate.py) holds drafts back while they miss: a cold
stream's head still reads each round's states and makes one guess, not sent, checked
against the target's sample there. ``MLXBUN_SPEC_BATCH_GATE=0`` (the batch rows' switch;
the serial lane has none of its own) drafts every round.
The head's cache is filled while the prompt is read (:meth:`MtpStream.read`); positions
a prefix-cache hit skipped have no hidden state, so its rows start after them (drafts
still verify; they only see less context).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import cache_ops
from ...runconfig import current
from .gate import LandingGate
from .guided import Plan, sampled, verify, walk
from .stream import Emitted, SpecTally, count_round, grammar_of, process_window

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import LogitsProcessor, Sampler, TokenPredictor
    from ...grammar.base import GrammarProcessor
    from ..fill.forced import FillSession


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
                 usage: dict[str, int], tally: SpecTally | None = None,
                 fill: FillSession | None = None):
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
        self.grammar = grammar_of(processors)  # drafts walk its matcher (module docstring)
        self.fill = fill if self.grammar is not None else None
        self._guide: tuple[Plan, list[int]] | None = None  # the window's plan, sampled at
        # drafts ride while they land (a missed one costs a wider window, under a
        # grammar the forced run after it): the gate every drafter shares (gate.py),
        # open at the start; without a grammar it can be switched off (module docstring)
        self.gate = LandingGate(hot=True)
        self.gated = self.grammar is not None or current().speculation.batch_gate
        self._guess: mx.array | None = None  # a cold stream's free check, not sent

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
        # a fill round's entries carry their forced run third (guided.Entry), others two
        ahead = sum(1 + len(e[2]) for e in out if len(e) > 2)  # type: ignore[misc]
        self._launch(kept[-1], mx_tokens(kept), ahead)
        if self.fill is not None and self._guide is not None:
            plan = self._guide[0]  # its forced run after the last token rides now
            # (the last entry of a fill round is a guided.Entry, whose third is its run)
            out[-1][2].extend(plan.tokens[:plan.head])  # type: ignore[misc]
            self.fill.count(plan.head)
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
        if self._guide is not None:
            return self._read_guided()
        hidden, samples_arr, logprobs, drafts_arr = self._window
        samples = _ints(samples_arr)
        drafts = _ints(drafts_arr) if drafts_arr is not None else []
        accepted = 0
        while accepted < len(drafts) and samples[accepted] == drafts[accepted]:
            accepted += 1
        if drafts:
            self._count(len(drafts), accepted)
            self.gate.landed(accepted)
        elif self._guess is not None:
            self.gate.checked(_ints(self._guess)[0] == samples[0])
        self._guess = None
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
        guide, self._guide = self._guide, None
        self._guess = None
        drop = 0 if window is None or window[3] is None else int(window[3].shape[0])
        if guide is not None:  # a forced run after the last token was handed out: it stays
            drop = len(guide[0].tokens) - guide[0].head
        if drop and self.trimmable:
            cache_ops.trim(self.cache, drop)

    # -- internals -------------------------------------------------------------------
    def _draft(self, after: mx.array) -> mx.array | None:
        """``n`` drafts from the head: the first from the pending states paired with the
        tokens ``after`` them, the rest chained on the head's own output."""
        import mlx.core as mx

        if self.hidden is None or self.n < 1:
            return None
        logits, state = self.predictor.predict(self.hidden, after[None], self.head_cache)
        self.hidden = None
        if self.gated and not self.gate.hot:  # the free check: a guess, not sent
            self._guess = self.sample_draft(logits)
            return None
        drafts = [self.sample_draft(logits)]
        for _ in range(self.n - 1):
            logits, state = self.predictor.predict(state[:, -1:], drafts[-1][None],
                                                   self.head_cache)
            drafts.append(self.sample_draft(logits))
        if self.n > 1:  # chained rows rest on drafts: the next round rebuilds them
            cache_ops.trim(self.head_cache, self.n - 1)
        return mx.concatenate(drafts)

    def sample_draft(self, logits: mx.array) -> mx.array:
        """One draft token from the head's ``logits``, by the request's sampler."""
        import mlx.core as mx

        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampler(logprobs).astype(mx.uint32).reshape(1)

    def _launch(self, token: int, after: mx.array | None, ahead: int = 0) -> None:
        """Queue the head's drafts and the target's forward over the refed tokens (after a
        recurrent rollback), ``token`` and the drafts (under a grammar: the plan's tokens;
        ``ahead``: tokens produced and not yet handed out, for fill's room)."""
        import mlx.core as mx

        if len(self._refeed) > MAX_REFEED:  # consecutive rollbacks: feed them on their own
            self.predictor.forward(mx_tokens(self._refeed)[None], self.cache)
            self.fed.extend(self._refeed)
            self._refeed = []
        self._guide = None
        if self.grammar is not None:
            plan = self._walk(token, after, ahead) if after is not None else Plan([], [])
            self._guide = (plan, sampled(plan))
            drafts = mx_tokens(plan.tokens) if plan.tokens else None
        else:
            drafts = self._draft(after) if after is not None else None
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
        at = None if self._guide is None else self._guide[1]
        if at is not None and len(at) < logits.shape[0]:  # forced positions: no sample
            logits = logits[mx.array(at)]
        if self.processors:
            logits = process_window(self.processors, logits, self.fed, inputs[skip:],
                                    done + skip, at)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samples = self.sampler(logprobs)
        mx.async_eval(samples, logprobs, hidden,
                      *(a for a in (drafts, self._guess) if a is not None))
        self.fed.append(token)
        self._window = (hidden, samples, logprobs, None if at is not None else drafts)
        self.usage["targetCalls"] += 1
        if self.tally is not None:
            self.tally.target_calls += 1

    def _walk(self, token: int, after: mx.array, ahead: int) -> Plan:
        """The window's plan after ``token`` under the grammar (``guided.walk``) with the
        head's guesses; the head then holds the states it read and nothing chained."""
        g, fill = self._grammar, self.fill
        drafter = HeadDrafter(self, after, g)
        room = fill.room(ahead) if fill is not None else self.n
        try:
            return walk(g, [*self.fed, *self._refeed, token], drafter, room,
                        self.n if self.gate.hot else 0, fill)
        finally:
            drafter.close()

    def _read_guided(self) -> tuple[list[Emitted], list[int]]:
        """:meth:`_read` for a planned window: the kept plan tokens and the sample after
        them; with fill, one entry ``(token, logprobs, run)`` as the guided stream's."""
        assert self._window is not None and self._guide is not None
        hidden, samples_arr, logprobs, _ = self._window
        plan, at = self._guide
        index = {p: k for k, p in enumerate(at)}
        samples = _ints(samples_arr)
        kept, accepted = verify(plan, samples, index)
        token = samples[index[kept]]
        if plan.drafted:
            self._count(plan.drafted, accepted)
            self.gate.landed(accepted)
        elif plan.guess is not None:  # the free check
            self.gate.checked(plan.guess == token)
        back = len(plan.tokens) - kept
        if back:
            self._rollback(len(plan.tokens), plan.tokens[:kept])
            self._grammar.rollback(back)
        else:
            self.fed.extend(plan.tokens)
        self.hidden = hidden[:, :kept + 1]
        tokens = [*plan.tokens[:kept], token]
        carry, self._carry = self._carry, []
        if self.fill is None:
            if accepted:  # ``done`` is read per token: this step hands out several
                self._grammar.done = False
            return carry + [(t, logprobs[index[j]]) for j, t in enumerate(tokens)], tokens
        self.fill.count(plan.forced[plan.head:kept].count(True))  # runs kept past drafts
        new = tokens[plan.head:]
        entry = (new[0], logprobs[index[plan.head]], new[1:])
        # the round's last entry carries the forced run after it (a guided.Entry)
        return [*carry, entry], tokens  # type: ignore[list-item]

    @property
    def _grammar(self) -> GrammarProcessor:
        assert self.grammar is not None  # (guided rounds only)
        return self.grammar

    def _rollback(self, drafted: int, kept: list[int]) -> None:
        """Take the rejected drafts back out of the target's cache (``kept``: the drafts
        accepted)."""
        if self.trimmable:
            cache_ops.trim(self.cache, drafted - len(kept))
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


class HeadDrafter:
    """The head's guesses along a plan: the first from the round's pending states (paired
    with the tokens ``after`` them), each next chained on the head's own state with the
    plan's token there (forced or a draft), sampled under the grammar's mask."""

    def __init__(self, stream: MtpStream, after: mx.array, grammar: GrammarProcessor):
        self.stream, self.after, self.grammar = stream, after, grammar
        self.logits: mx.array | None = None
        self.state: mx.array | None = None
        self.seen = self.chained = 0

    def guess(self, plan: list[int]) -> int | None:
        s = self.stream
        if self.state is None and not self._read():
            return None
        assert self.state is not None
        for t in plan[self.seen:]:
            self.logits, self.state = s.predictor.predict(
                self.state[:, -1:], mx_tokens([t])[None], s.head_cache)
            self.chained += 1
        self.seen = len(plan)
        assert self.logits is not None
        return _ints(s.sample_draft(self.grammar.mask_guess(self.logits)))[0]

    def close(self) -> None:
        """The pending states are read even where nothing was guessed; the chained
        positions leave the head's cache (the next round rebuilds them)."""
        if self.state is None:
            self._read()
        if self.chained:
            cache_ops.trim(self.stream.head_cache, self.chained)

    def _read(self) -> bool:
        s = self.stream
        if s.hidden is None or s.n < 1:
            return False
        self.logits, self.state = s.predictor.predict(s.hidden, self.after[None], s.head_cache)
        s.hidden = None
        return True


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
    for c, saved in zip(cache, snapshot, strict=True):
        if saved is None:
            cache_ops.trim([c], window)
        else:
            cache_ops.restore_arrays(c, saved)
