"""MTP speculation on the batch lane: every MTP row drafts with the model's head from its
own hidden states, on the device, and its drafts ride in the batch's decode step beside
plain, prompt-lookup and forced rows (``engine/batch/windows.py`` verifies them all in
one forward and takes rejected positions back: a shorter block table, and for
recurrent layers the state from before the window with the kept tokens fed again).

:class:`MtpBatch` is the executor's tap (``engine/batch/executor.py``): a pass carrying
an MTP row runs through the predictor's ``forward`` (the target's logits and hidden
states), and each MTP row gets its states:

- a prefill chunk's states, paired with the prompt tokens after them, join the row's
  head KV at once (positions a prefix-cache hit skipped have no state: the head starts
  after them, its drafts still verify, they only see less context);
- a decode step's states at the positions the row kept wait (``pending``) for the
  token after the last of them, the row's next input, which is still on the device.

Before each decode step :meth:`MtpBatch.drafts` appends every row's pending states
(the last with its next input, taken from the batch's device array) and chains ``n``
drafts on the head's own output, for all rows in ``n + 1`` head calls at most. Nothing
is read on the host: the verify pass reads the drafts back with its samples. The
heads' KV is paged (``mtp_head.py``).

A row drafts only while its drafts land (``gate.py``, the gate every drafter shares): a
round that keeps none stops it, and it decodes as a plain row (pipelined steps, no
window) while the head's first guess, sampled but not sent, is checked against the token
the target then samples there (read a step later, once that token is on the host): at
once, then on every 2nd, 4th... step of :class:`MtpBatch`'s count after each miss, up to
``PROBE_BACKOFF`` (cold rows check together); its states wait for the next check and
join the head in one call. Two guesses in a row that came true send drafts again.
``MLXBUN_SPEC_BATCH_GATE=0``: every row drafts every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ...runconfig import current
from ..batch.windows import refeed_cap
from .gate import LandingGate
from .mtp import HeadState
from .mtp_guided import guided_drafts, walks_for
from .mtp_head import HeadPages, pageable

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import Sampler, TokenPredictor
    from ..batch import Batch
    from ..batch.layout import Slot
    from ..batch.rows import Row
    from .stream import SpecTally

PROBE_BACKOFF = 8
"""The longest period of a cold MTP row's free checks, in steps (each costs a head call
over the states since the last one; cold rows check on the same steps)."""


@dataclass
class _Row:
    n: int  # drafts per step
    sampler: Sampler | None  # None: greedy
    usage: dict[str, int]  # its session's speculation counts
    hidden: mx.array | None = None  # (1, k, H) target states the head has not read
    after: list[int] = field(default_factory=list)  # the tokens after all but the last
    gate: LandingGate | None = None  # None: drafts every step
    # free checks waiting for their token: (the row's position it guessed, the guess)
    checks: list[tuple[int, mx.array]] = field(default_factory=list)

    @property
    def hot(self) -> bool:
        return self.gate is None or self.gate.hot


class MtpBatch:
    """The batch lane's MTP rows (by the batch's uid), their heads and drafts."""

    def __init__(self, predictor: TokenPredictor, tally: SpecTally | None = None):
        self.predictor = predictor
        self.tally = tally
        self.rows: dict[int, _Row] = {}
        self._pages: HeadPages | None = None  # made with the first row
        self._slots: list[Slot] | None = None  # the head's cache layers; []: not pageable
        self._step = 0  # decode steps drafted for (the gates' shared clock)

    def supported(self) -> bool:
        """Whether the head's cache can be paged (asked with the first MTP request: it
        reads the head's weights)."""
        if self._slots is None:
            self._slots = pageable(self.predictor.make_cache()) or []
        return bool(self._slots)

    @property
    def pages(self) -> HeadPages:
        if self._pages is None:
            assert self.supported()
            assert self._slots
            self._pages = HeadPages(self.predictor, self._slots)
        return self._pages

    # -- rows ----------------------------------------------------------------------------
    def add(self, uid: int, n: int, sampler: Sampler | None, usage: Any,
            head: HeadState | None = None) -> None:
        """Track row ``uid`` drafting ``n`` tokens a step (``usage``: its session's); a
        lone stream's ``head`` comes with it (its refed tokens go to the batch row)."""
        if usage.speculation is None:
            usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
            if self.tally is not None:
                self.tally.requests += 1
        self.pages.add(uid, None if head is None else head.cache)
        gated = current().speculation.batch_gate
        row = _Row(n, sampler, usage.speculation,
                   gate=LandingGate(hot=True, backoff=PROBE_BACKOFF) if gated else None)
        if head is not None:
            row.hidden, row.after = head.hidden, list(head.after)
        self.rows[uid] = row

    def drop(self, uid: int) -> None:
        if self.rows.pop(uid, None) is not None:
            self.pages.drop(uid)

    def reset(self) -> None:
        """Forget every row (after a failed pass the heads' pool may be half written)."""
        self.rows.clear()
        self._pages = None

    def leaving(self, uid: int, refeed: list[int]) -> HeadState:
        """Row ``uid`` goes on outside the batch: its head as mlx-lm caches, its pending
        states, and ``refeed`` (the batch row's tokens to feed again)."""
        row = self.rows[uid]
        return HeadState(self.pages.export(uid), row.hidden, list(row.after), list(refeed))

    def count(self, uid: int, drafted: int, accepted: int) -> None:
        """Row ``uid``'s drafts in the last step: how many were fed, how many kept."""
        row = self.rows.get(uid)
        if row is not None:
            row.usage["drafted"] += drafted
            row.usage["accepted"] += accepted
            if row.gate is not None and drafted:
                row.gate.landed(accepted)
                row.checks.clear()  # (guesses from before this round say less)
        if self.tally is not None and drafted:
            self.tally.drafted += drafted
            self.tally.accepted += accepted
            self.tally.rounds += 1

    def stepped(self, uids: set[int]) -> None:
        """Rows that took part in a forward pass (``targetCalls``)."""
        for uid in uids:
            row = self.rows.get(uid)
            if row is not None:
                row.usage["targetCalls"] += 1

    # -- the executor's tap ----------------------------------------------------------------
    def forward(self, inputs: mx.array, caches: list[Any]) -> tuple[mx.array, mx.array]:
        return self.predictor.forward(inputs, caches)

    def prompt(self, uids: list[int], hidden: mx.array, after: list[list[int]]) -> None:
        import mlx.core as mx

        width = max(len(a) for a in after)
        tokens = mx.array([a + [0] * (width - len(a)) for a in after], dtype=mx.uint32)
        self.pages.append(uids, hidden[:, :width], tokens, [len(a) for a in after])

    def kept(self, uid: int, hidden: mx.array, fed: list[int]) -> None:
        import mlx.core as mx

        row = self.rows.get(uid)
        if row is None:
            return
        if row.hidden is None:
            row.hidden, row.after = hidden, list(fed[1:])
        else:  # (states no draft call took yet: the last of them is followed by fed[0])
            row.hidden = mx.concatenate([row.hidden, hidden], axis=1)
            row.after += fed

    def arrays(self) -> list[mx.array]:
        checks = [g for r in self.rows.values() for _, g in r.checks]
        return checks + ([] if self._pages is None else self._pages.arrays())

    # -- drafts ----------------------------------------------------------------------------
    def drafts(self, batch: Batch) -> dict[int, mx.array | list[int]]:
        """The next decode step's drafts of every MTP row with pending states (device
        arrays; host tokens for rows with logits processors, whose guesses are walked
        under them); the pending states join the heads either way."""
        import mlx.core as mx

        x = batch.next_tokens
        if x is None:
            return {}
        self._settle(batch)
        self._step += 1
        at = {u: i for i, u in enumerate(batch.decoding) if u in self.rows
              and self.rows[u].hidden is not None and _due(self.rows[u], self._step)}
        if not at:
            return {}
        uids = list(at)
        rows = [self.rows[u] for u in uids]
        self._extra(uids, rows)
        last = mx.concatenate([_last(r) for r in rows])
        xs = x[mx.array([at[u] for u in uids])].astype(mx.uint32)[:, None]
        logits, state = self.pages.append(uids, last, xs, [1] * len(uids))
        for r in rows:
            r.hidden, r.after = None, []
        cap = refeed_cap()
        depth = {u: r.n if r.hot and len(batch.refeeding(u)) < cap else 0
                 for u, r in zip(uids, rows)}
        self._guess(batch, uids, rows, logits)
        going = [j for j, u in enumerate(uids) if depth[u] > 0]
        if not going:
            return {}
        if self.tally is not None:
            self.tally.batch_steps += 1
        guided = [j for j in going if batch.rows[uids[j]].processors]
        free = [j for j in going if j not in guided]
        out: dict[int, mx.array | list[int]] = {}
        if free:
            pick = mx.array(free)
            chained = self._chain([uids[j] for j in free], [rows[j].sampler for j in free],
                                  logits[pick], state[pick], max(depth[uids[j]] for j in free))
            out.update({uids[j]: chained[k, :depth[uids[j]]] for k, j in enumerate(free)})
        if guided:
            out.update(self._guided(batch, [uids[j] for j in guided], logits, state, guided,
                                    depth))
        return out

    def _guided(self, batch: Batch, uids: list[int], logits: mx.array, state: mx.array,
                index: list[int], depth: dict[int, int]) -> dict[int, list[int]]:
        """Drafts of the rows with logits processors, walked on the host
        (``mtp_guided.py``); ``index``: their rows in ``logits`` and ``state``."""
        import mlx.core as mx

        assert batch.next_tokens is not None  # (a decoding batch has its next tokens)
        tokens = cast("list[int]", batch.next_tokens.tolist())
        at = {u: i for i, u in enumerate(batch.decoding)}
        walks = walks_for([batch.rows[u] for u in uids], [tokens[at[u]] for u in uids],
                          [depth[u] for u in uids], [self.rows[u].sampler for u in uids])
        pick = mx.array(index)
        return guided_drafts(self.pages, uids, walks, logits[pick], state[pick], _sample)

    def _guess(self, batch: Batch, uids: list[int], rows: list[_Row], logits: mx.array
               ) -> None:
        """The free checks of the cold rows among ``uids``: each one's first draft, sampled
        and kept for the position after its next input (not sent)."""
        import mlx.core as mx

        cold = [j for j, r in enumerate(rows) if not r.hot]
        if not cold:
            return
        guesses = _sample([rows[j].sampler for j in cold], logits[mx.array(cold)])
        for k, j in enumerate(cold):
            b = batch.rows[uids[j]]
            rows[j].checks.append((len(b.tokens) + len(b.refeed) + 1, guesses[k]))

    def _settle(self, batch: Batch) -> None:
        """Free checks whose position the row has fed since (the guess was computed with
        the step it was made for, so reading it waits on nothing)."""
        for uid, row in self.rows.items():
            b = batch.rows.get(uid)
            if not row.checks or row.gate is None or b is None:
                continue
            while row.checks and row.checks[0][0] < len(b.tokens) + len(b.refeed):
                at, guess = row.checks.pop(0)
                row.gate.checked(cast("int", guess.item()) == _token_at(b, at))

    def _extra(self, uids: list[int], rows: list[_Row]) -> None:
        """Append every pending state but each row's last, with the tokens after them."""
        import mlx.core as mx

        heads = [0 if r.hidden is None else int(r.hidden.shape[1]) - 1 for r in rows]
        more = [j for j, k in enumerate(heads) if k > 0]
        if not more:
            return
        width = max(heads)
        grid = []
        for j in more:
            states = rows[j].hidden
            assert states is not None
            states = states[:, :-1]
            if heads[j] < width:
                pad = mx.zeros((1, width - heads[j], states.shape[-1]), dtype=states.dtype)
                states = mx.concatenate([states, pad], axis=1)
            grid.append(states)
        tokens = mx.array([rows[j].after + [0] * (width - len(rows[j].after)) for j in more],
                          dtype=mx.uint32)
        self.pages.append([uids[j] for j in more], mx.concatenate(grid), tokens,
                          [heads[j] for j in more])

    def _chain(self, uids: list[int], samplers: list[Sampler | None], logits: mx.array,
               state: mx.array, depth: int) -> mx.array:
        """``(rows, depth)`` drafts: the first from ``logits``, the rest chained on the
        head's own output (their positions leave the heads again)."""
        import mlx.core as mx

        drafts = [_sample(samplers, logits)]
        if depth > 1:
            lengths = [self.pages.length(u) for u in uids]
            for _ in range(depth - 1):
                logits, state = self.pages.append(uids, state[:, -1:], drafts[-1][:, None],
                                                  [1] * len(uids))
                drafts.append(_sample(samplers, logits))
            self.pages.rewind(uids, lengths)
        return mx.stack(drafts, axis=1)


def _due(row: _Row, step: int) -> bool:
    """Whether the row's head reads its states this step (always without a gate)."""
    return row.gate is None or row.gate.due(step)


def _token_at(row: Row, at: int) -> int:
    """The row's token at position ``at`` (in its KV, or fed again next)."""
    n = len(row.tokens)
    return row.tokens[at] if at < n else row.refeed[at - n]


def _last(row: _Row) -> mx.array:
    assert row.hidden is not None
    return row.hidden[:, -1:]


def _sample(samplers: list[Sampler | None], logits: mx.array) -> mx.array:
    """Each row's draft with its own sampler (one call when they share one; None is
    greedy)."""
    import mlx.core as mx

    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    first = samplers[0]
    if all(s is first for s in samplers):
        out = mx.argmax(logprobs, axis=-1) if first is None else first(logprobs)
    else:
        out = mx.concatenate([mx.argmax(logprobs[r:r + 1], axis=-1) if s is None
                              else s(logprobs[r:r + 1]) for r, s in enumerate(samplers)])
    return out.astype(mx.uint32).reshape(-1)
