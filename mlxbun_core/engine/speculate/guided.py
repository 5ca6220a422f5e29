"""Fill what is forced, draft what is free: the windows of one constrained stream whose
request both fills (``--fill strict``) and drafts by prompt lookup (the serial lane and
the batch lane's lone stream).

A window is ``[x, *plan]``. The plan is a walk of the grammar's matcher from ``x``: a
token the grammar leaves no choice about joins as *forced*; where it leaves a choice,
the lookup's next guess joins as a *draft* when the matcher allows it (and drafts are
landing, the same free check as :class:`~.stream.SpecStream`'s). The walk ends at a
forbidden guess, the draft or span cap, the completion limit, or (past the leading
forced run) a state where only EOS may follow. A forced token is kept whenever every
token before it is; a draft is kept while it equals the target's sample at the position
before it. The model therefore samples only where a draft is checked and at the
window's end: forced positions cost their share of the forward, no mask and no draw.
Greedy output is plain constrained decoding's (every emitted free token is a sample).

A step hands out one entry ``(token, logprobs, run)``: the first new token and the rest
as its run (fill never runs with logprobs), so the grammar's "only EOS may follow"
check reads the state after the whole step. The forced run after the step's last token
(the next window's head, already fed) goes out with it, as fill hands out its runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .stream import SpecStream, _ints, _trim, process_window, rewindable

if TYPE_CHECKING:
    import mlx.core as mx

    from ...grammar.base import GrammarProcessor
    from ..fill.forced import FillSession
    from .lookup import PromptLookup

Entry = tuple[int, "mx.array", list[int]]
"""A token, its log-probabilities and the tokens handed out after it (its run)."""


@dataclass
class Plan:
    """The tokens a window feeds after ``x``, which of them are forced, and the lookup's
    guess for the first free position (the free check when no draft rides)."""

    tokens: list[int]
    forced: list[bool]
    guess: int | None = None

    @property
    def head(self) -> int:
        """The leading forced run's length (fill's run after ``x``)."""
        return next((i for i, f in enumerate(self.forced) if not f), len(self.forced))

    @property
    def drafted(self) -> int:
        return self.forced.count(False)


class Drafter(Protocol):
    """Where a plan's drafts come from (prompt lookup, the model's MTP head)."""

    def guess(self, plan: list[int]) -> int | None:
        """The next token guessed after the last fed token and ``plan`` (None: none)."""
        ...


class LookupDrafter:
    """Prompt lookup's guesses along a plan: its proposal followed while the plan agrees
    with it, looked up again from the plan's end where it went elsewhere."""

    def __init__(self, lookup: PromptLookup, n: int) -> None:
        self.lookup, self.n = lookup, n
        self.proposal, self.i, self.seen = lookup.propose(n + 1), 0, 0

    def guess(self, plan: list[int]) -> int | None:
        for t in plan[self.seen:]:
            if self.i < len(self.proposal) and self.proposal[self.i] == t:
                self.i += 1
            else:  # the plan went elsewhere: look again from its end
                self.proposal, self.i = self.lookup.propose_after(plan, self.n + 1), 0
                break
        self.seen = len(plan)
        if plan and self.i >= len(self.proposal):
            self.proposal, self.i = self.lookup.propose_after(plan, self.n + 1), 0
        return self.proposal[self.i] if self.i < len(self.proposal) else None


def walk(g: GrammarProcessor, fed: list[int], drafter: Drafter, room: int, drafts: int,
         fill: FillSession | None) -> Plan:
    """A window's plan: walk the matcher from the last token of ``fed`` and take it back
    (see the module's docstring). ``room``: the plan's longest; ``drafts``: the most
    drafts (0: the first free position's guess is still asked, for the free check);
    ``fill``: forced tokens join (None: drafts only)."""
    plan = Plan([], [])
    if not g.catch_up(fed):
        return plan
    spans = fill.policy.max_span if fill is not None else 0
    while len(plan.tokens) < room:
        single = fill.single() if fill is not None else None
        if single is not None:
            if plan.forced.count(True) >= spans or not g.matcher.try_token(single):
                break
            if plan.drafted and g.only_eos():  # past a draft: left to be sampled
                g.matcher.rollback(1)
                break
            plan.tokens.append(single)
            plan.forced.append(True)
            continue
        if plan.drafted >= drafts and plan.drafted:
            break
        guess = drafter.guess(plan.tokens)
        if plan.guess is None and not plan.drafted:
            plan.guess = guess
        if guess is None or plan.drafted >= drafts or not g.try_draft(guess):
            break
        plan.tokens.append(guess)
        plan.forced.append(False)
    if plan.tokens:
        g.matcher.rollback(len(plan.tokens))
    return plan


def sampled(plan: Plan) -> list[int]:
    """The window positions ``[x, *plan]`` samples at: before each draft, and the last."""
    last = len(plan.tokens)
    return [j for j in range(last) if not plan.forced[j]] + [last]


def verify(plan: Plan, samples: list[int], index: dict[int, int]) -> tuple[int, int]:
    """``(kept, accepted)``: the plan's tokens kept (a forced one whenever every token
    before it is, a draft while it equals the sample before it) and its drafts accepted;
    ``samples[index[p]]`` is the sample at window position ``p``."""
    kept = accepted = 0
    for j, (t, forced) in enumerate(zip(plan.tokens, plan.forced)):
        if not forced:
            if samples[index[j]] != t:
                break
            accepted += 1
        kept += 1
    return kept, accepted


@dataclass
class _Window:
    plan: Plan
    at: list[int]  # the window positions sampled: before each draft, and the last
    samples: mx.array
    logprobs: mx.array


class GuidedStream(SpecStream):
    """A :class:`SpecStream` that also fills: see the module's docstring."""

    def __init__(self, *args: Any, fill: FillSession, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.grammar is not None  # a fill session means a grammar processor
        self.fill = fill
        self.window: _Window | None = None
        self._pending: Entry | None = None  # a resumed row's token and its forced run

    @property
    def running(self) -> bool:
        return self.window is not None

    def begin(self, token: int, emit: tuple[int, mx.array] | None = None) -> None:
        """Feed ``token`` first; ``emit``: it was sampled but not handed out yet (a row
        back from the batch), so its forced run rides now and goes out with it."""
        self._feed([token])
        plan = self._plan(1) if emit is not None else Plan([], [])
        if emit is not None:
            self._pending = (emit[0], emit[1], plan.tokens[:plan.head])
            self.fill.count(plan.head)
        self.window = self._run(token, plan)

    # a guided step hands out (token, logprobs, forced run) entries, the plain stream's
    # are (token, logprobs): the lanes read both through the run's length
    def step(self) -> list[Entry]:  # type: ignore[override]
        window = self.window
        assert window is not None  # begun
        plan, samples = window.plan, _ints(window.samples)
        index = {p: k for k, p in enumerate(window.at)}
        kept, accepted = verify(plan, samples, index)
        token = samples[index[kept]]  # the correction, or the bonus after the whole plan
        back = len(plan.tokens) - kept
        if back:
            _trim(self.cache, back)
            self._grammar.rollback(back)
        self.fill.count(plan.forced[plan.head:kept].count(True))  # runs kept past drafts
        if plan.drafted:
            self._count(plan.drafted, accepted)
            self.gate.landed(accepted)
        else:  # the free check: the lookup's guess against the token sampled there
            self.gate.checked(plan.guess == token)
        self._feed([*plan.tokens[:kept], token])
        new = [*plan.tokens[plan.head:kept], token]
        first = window.logprobs[index[plan.head]]
        entry: Entry = (new[0], first, new[1:])
        if self._pending is not None:
            x, lp, run = self._pending
            entry, self._pending = (x, lp, [*run, *new]), None
        nxt = self._plan(1 + len(entry[2]))
        entry[2].extend(nxt.tokens[:nxt.head])
        self.fill.count(nxt.head)
        self.window = self._run(token, nxt)
        return [entry]

    def settle(self) -> tuple[mx.array, mx.array]:
        """Stop: the drafts in flight leave the cache and the matcher, the forced run
        after the last token (handed out already) stays; ``(token array, logprobs)``
        sampled after it, not yet fed."""
        window = self.window
        assert window is not None and self._pending is None
        self.window = None
        plan = window.plan
        drop = len(plan.tokens) - plan.head
        if drop:
            _trim(self.cache, drop)
            self._grammar.rollback(drop)
        self._feed(plan.tokens[:plan.head])
        at = window.at.index(plan.head)
        return window.samples[at:at + 1], window.logprobs[at]

    # -- internals -------------------------------------------------------------------
    @property
    def _grammar(self) -> GrammarProcessor:
        assert self.grammar is not None  # (__init__)
        return self.grammar

    def _plan(self, ahead: int) -> Plan:
        """The next window's plan from the last fed token (``ahead``: tokens produced and
        not yet handed to the text session)."""
        drafts = self.n if self.gate.hot else 0
        plan = walk(self._grammar, self.fed, LookupDrafter(self.lookup, self.n),
                    self.fill.room(ahead), drafts, self.fill)
        if plan.drafted and not rewindable(self.cache, len(plan.tokens) + 1):
            head = plan.head  # drafts need a cache that takes positions back
            plan.tokens, plan.forced = plan.tokens[:head], plan.forced[:head]
        return plan

    def _run(self, x: int, plan: Plan) -> _Window:
        """Queue the forward of ``[x, *plan]`` and the samples at the positions that
        need one (before each draft, and the last)."""
        import mlx.core as mx

        inputs = mx.array([x, *plan.tokens], dtype=mx.uint32)
        last, at = len(plan.tokens), sampled(plan)
        logits = self.model(inputs[None], cache=self.cache)[0]
        if len(at) < last + 1:
            logits = logits[mx.array(at)]
        if self.processors:
            logits = process_window(self.processors, logits, self.fed, inputs,
                                    len(self.fed) - 1, at)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samples = self.sampler(logprobs)
        mx.async_eval(samples, logprobs)
        self.usage["targetCalls"] += 1
        if self.tally is not None:
            self.tally.target_calls += 1
        return _Window(plan, at, samples, logprobs)
