"""MTP speculation on the batch lane: every MTP row drafts from its own hidden states with
the model's head, all rows verify in one target forward, rows without drafts decode
plainly in the same step.

While the batch holds an MTP row, :class:`MtpBatch` takes its decode step (in place of
``GenerationBatch.next``; the prompt part of the turn runs as always), because only the
predictor's forward hands back the hidden states the head reads. One step:

1. each MTP row's head turns the states kept last step (paired with the tokens after
   them) into ``n`` drafts (chained; the chained rows leave its cache at once);
2. every row is fed ``[refeed..., x, drafts...]`` (``x`` its pending token), right-padded
   to one width, in one forward through the predictor; samples at every position with
   the row's own sampler (a row with logits processors carries no drafts and is processed
   at its one real position, as mlx-lm would);
3. a row accepts drafts while they equal its samples; the emitted tokens are the
   target's samples, so greedy output is the plain decode's;
4. the cache goes back per row. Attention layers (``BatchKVCache``) drop each row's
   rejected and padded positions (trim what all drop, shift the rest into the row's left
   padding: :func:`.batch._rollback`). Recurrent layers (``ArraysCache``: Qwen3.5's
   gated-DeltaNet) cannot drop positions, so the window runs with the cache's per-row
   ``lengths`` mask (padding never enters a row's state), and a row that rejected a draft
   has its state put back from before the window (a per-row select from the snapshot)
   and its attention positions dropped whole: its kept tokens are fed again ahead of the
   next window (``refeed``), as the serial loop does.

The head's cache is per row (its own ``KVCache``, one row per target position whose next
token is known). The prompt's rows come from mlx-lm's batched prefill (``mtp_prompt``);
positions a prefix-cache hit skipped, or a plain step took (a fill step), have no hidden
state, so they get no head row: drafts still verify, they see less context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .batch import _responses, _rollback, _sample
from .mtp_head import HeadBatch
from .stream import SpecTally

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import Sampler, TokenPredictor

MAX_REFEED = 4
"""A row carrying this many refed tokens sends no drafts until they are fed (a window
without drafts cannot be rejected). Lower than the serial loop's: every row of the step
pays for the widest window."""


@dataclass
class _Row:
    head_cache: list[Any]
    n: int  # drafts per step
    usage: dict[str, int]
    prompt: list[int]  # the row's prompt (its states reach the head as it is read)
    pos: int  # the prompt position read next
    # (1, k, H) target states not yet given to the head; ``after``: the tokens after the
    # first k - 1 (the last one's is the row's pending token)
    hidden: mx.array | None = None
    after: list[int] = field(default_factory=list)
    refeed: list[int] = field(default_factory=list)  # emitted, taken back out of the cache


class MtpBatch:
    """The MTP rows of a batch lane (by BatchGenerator uid) and their verify step."""

    def __init__(self, predictor: TokenPredictor, tally: SpecTally | None = None):
        self.predictor = predictor
        self.rows: dict[int, _Row] = {}
        self.head = HeadBatch(predictor)  # the rows' heads, batched once they draft
        self.tally = tally

    def add(self, uid: int, n: int, usage: Any, prompt: list[int], start: int) -> None:
        """Track row ``uid`` drafting ``n`` tokens a step (``usage``: its session's), whose
        ``prompt`` is read from ``start`` (the tokens before came from the prefix cache)."""
        if usage.speculation is None:
            usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
            if self.tally is not None:
                self.tally.requests += 1
        self.rows[uid] = _Row(self.predictor.make_cache(), n, usage.speculation, prompt, start)

    def read(self, states: dict[int, mx.array]) -> None:
        """Prompt chunks just read: each row's states ``(1, m, H)`` of its next ``m``
        prompt positions, paired with the prompt tokens after them, join its head cache."""
        import mlx.core as mx

        caches = []
        for uid, hidden in states.items():
            row = self.rows[uid]
            m = int(hidden.shape[1])
            after = row.prompt[row.pos + 1:row.pos + m + 1]
            assert len(after) == m  # (the last prompt token is read by the first step)
            self.predictor.predict(hidden, mx.array(after, dtype=mx.uint32)[None],
                                   row.head_cache)
            row.pos += m
            caches += row.head_cache
        mx.eval([c.state for c in caches])

    def last_prompt_states(self, states: dict[int, mx.array]) -> None:
        """Each row's state at its last prompt token (its pending token follows it)."""
        for uid, hidden in states.items():
            row = self.rows[uid]
            row.hidden, row.after = hidden, []

    def drop(self, uid: int) -> None:
        self.rows.pop(uid, None)

    def fresh(self) -> None:
        """A new generator (after a failed step): forget every row and the heads' cache."""
        self.rows.clear()
        self.head = HeadBatch(self.predictor)

    def leaving(self, uid: int) -> tuple[list[Any], mx.array | None, list[int], list[int]]:
        """Row ``uid`` goes on outside the batch: its head cache, pending states, the
        tokens after them (but the last) and the tokens its cache still lacks."""
        row = self.rows[uid]
        head = self.head.extract(uid) or row.head_cache
        return head, row.hidden, list(row.after), list(row.refeed)

    def retain(self, uids: Any) -> None:
        for uid in [u for u in self.rows if u not in uids]:
            del self.rows[uid]

    def wants(self, gen: Any) -> bool:
        """Whether this turn's decode step is the MTP step: the batch holds an MTP row
        (and no row fills forced runs over plain attention caches, whose step is the fill
        batch's: MTP rows then wait a step; recurrent caches never fill in a batch)."""
        batch: Any = getattr(gen, "_generation_batch", None)
        if batch is None or not len(batch) or not any(u in self.rows for u in batch.uids):
            return False
        fills = getattr(batch, "fills", None)
        return not (fills and any(u in fills for u in batch.uids)
                    and not _recurrent(batch.prompt_cache))

    @contextmanager
    def turn(self, gen: Any,
             before: Callable[[list[int]], None] | None = None) -> Iterator[None]:
        """Around one BatchGenerator turn whose decode step is the MTP step (``before``:
        the lane's per-row adapter routing, run ahead of the forward)."""
        batch: Any = gen._generation_batch

        def verify() -> list[Any]:
            if before is not None:
                before(list(batch.uids))
            return self.step(batch)

        batch.next = verify  # this turn only
        try:
            yield
        finally:
            del batch.next

    def stepped(self, uids: set[int]) -> None:
        """Rows that took part in a forward pass (``targetCalls``)."""
        for uid in uids:
            row = self.rows.get(uid)
            if row is not None:
                row.usage["targetCalls"] += 1

    # -- the step ----------------------------------------------------------------------
    def step(self, batch: Any) -> list[Any]:
        """Draft, verify every row in one forward, settle the caches; answer as
        ``GenerationBatch.next`` would (a response per emitted token, in order)."""
        import mlx.core as mx

        if hasattr(batch, "runs"):
            batch.runs = {}  # no forced runs ride this step (fill/rows.py)
        uids, rows = list(batch.uids), [self.rows.get(u) for u in batch.uids]
        samplers = _samplers(batch)
        x = batch._next_tokens.astype(mx.uint32)
        drafts = self._drafts(uids, samplers, x)
        refeeds = [row.refeed if row is not None else [] for row in rows]
        window, lengths = _window(x, refeeds, drafts)
        width = window.shape[1]
        recurrent = [c for c in batch.prompt_cache if _is_recurrent(c)]
        snapshot = [list(c.cache) for c in recurrent]
        if min(lengths) < width:
            for c in recurrent:  # padded positions stay out of each row's state
                c.lengths = mx.array(lengths)
        try:
            logits, hidden = self.predictor.forward(window, batch.prompt_cache)
        finally:
            for c in recurrent:
                c.lengths = None
        logprobs = _normalized(_processed(batch, logits, x))
        samples = _sample(batch, logprobs)
        mx.eval(x, samples, *[d for d in drafts if d is not None])
        xs, sampled = cast("list[int]", x.tolist()), cast("list[list[int]]", samples.tolist())
        return self._settle(batch, uids, rows, xs, sampled, drafts, logprobs, hidden,
                            snapshot, recurrent, width)

    def _settle(self, batch: Any, uids: list[int], rows: list[_Row | None], xs: list[int],
                sampled: list[list[int]], drafts: list[mx.array | None], logprobs: mx.array,
                hidden: mx.array, snapshot: list[list[Any]], recurrent: list[Any],
                width: int) -> list[Any]:
        import mlx.core as mx

        offsets, accepted, keep, cached, pending, emitted_drafts = [], [], [], [], [], []
        restore = []
        for r, row in enumerate(rows):
            d = _ints(drafts[r]) if drafts[r] is not None else []
            refeed = row.refeed if row is not None else []
            k = len(refeed)
            a = 0
            while a < len(d) and sampled[r][k + a] == d[a]:
                a += 1
            back = bool(recurrent) and a < len(d)  # recurrent state cannot drop positions
            token = sampled[r][k + a]
            offsets.append(k)
            accepted.append(a)
            emitted_drafts.append(d)
            pending.append(token)
            restore.append(back)
            keep.append(0 if back else k + 1 + a)
            cached.append([] if back else [*refeed, xs[r], *d[:a]])
            if row is not None:
                self._count(row, len(d), a)
                row.hidden = hidden[r:r + 1, k:k + 1 + a]
                row.after = d[:a]
                row.refeed = [*refeed, xs[r], *d[:a]] if back else []
        if any(restore):
            _restore_rows(recurrent, snapshot, restore)
        attention = [c for c in batch.prompt_cache if not _is_recurrent(c)]
        if attention:
            _rollback(attention, [width - n for n in keep])
        if self.tally is not None and any(emitted_drafts):
            self.tally.batch_steps += 1  # (target calls: the lane's ``stepped``)
        previous = batch._next_logprobs
        batch._next_tokens = mx.array(pending, dtype=mx.uint32)
        batch._next_logprobs = [logprobs[r, offsets[r] + a] for r, a in enumerate(accepted)]
        return _responses(batch, xs, emitted_drafts, accepted, previous, logprobs,
                          offsets=offsets, cached=cached)

    def _drafts(self, uids: list[int], samplers: list[Sampler],
                x: mx.array) -> list[mx.array | None]:
        """Every MTP row's drafts (by batch position), from the heads' batched calls
        (``mtp_head``): None for rows without a head or with nothing pending to draft
        from. Pending states join the head's cache either way."""
        at = {uid: r for r, uid in enumerate(uids) if uid in self.rows}
        out: list[mx.array | None] = [None] * len(uids)
        if not at or all(self.rows[uid].hidden is None for uid in at):
            return out
        self.head.sync(list(at), {uid: self.rows[uid].head_cache for uid in at})
        rows = [self.rows[uid] for uid in self.head.uids]
        depths = [row.n if len(row.refeed) < MAX_REFEED else 0 for row in rows]
        drafts = self.head.draft([row.hidden for row in rows], [row.after for row in rows],
                                 [x[at[uid]:at[uid] + 1] for uid in self.head.uids],
                                 max(1, *depths), [samplers[at[uid]] for uid in self.head.uids])
        for j, (row, uid) in enumerate(zip(rows, self.head.uids, strict=True)):
            if row.hidden is not None and depths[j]:
                out[at[uid]] = drafts[j, :depths[j]]
            row.hidden, row.head_cache = None, []  # (its own cache is in the batch's now)
        return out

    def _count(self, row: _Row, drafted: int, accepted: int) -> None:
        row.usage["drafted"] += drafted
        row.usage["accepted"] += accepted
        if self.tally is not None and drafted:
            self.tally.drafted += drafted
            self.tally.accepted += accepted
            self.tally.rounds += 1


def supported(cache: list[Any]) -> bool:
    """Whether a model's single-row cache (``make_prompt_cache``) can take the MTP step
    in a batch: plain KV (it becomes ``BatchKVCache``) and recurrent ``ArraysCache``
    layers only (not sliding windows or quantized KV)."""
    from mlx_lm.models.cache import ArraysCache, KVCache

    return bool(cache) and all(type(c) in (KVCache, ArraysCache) for c in cache)


def _is_recurrent(c: Any) -> bool:
    from mlx_lm.models.cache import ArraysCache

    return isinstance(c, ArraysCache)


def _recurrent(cache: list[Any]) -> bool:
    return any(_is_recurrent(c) for c in cache)


def _samplers(batch: Any) -> list[Sampler]:
    rows = len(batch.uids)
    return [batch.fallback_sampler if s is None else s
            for s in (batch.samplers or [None] * rows)]


def _normalized(logits: mx.array) -> mx.array:
    import mlx.core as mx

    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _window(x: mx.array, refeeds: list[list[int]],
            drafts: list[mx.array | None]) -> tuple[mx.array, list[int]]:
    """Each row's ``[refeed..., x, drafts...]`` right-padded to one width; the rows'
    real lengths."""
    import mlx.core as mx

    lengths = [len(f) + 1 + (0 if d is None else int(d.shape[0]))
               for f, d in zip(refeeds, drafts, strict=True)]
    width = max(lengths)
    if width == 1:
        return x[:, None], lengths
    rows = []
    for r, (f, d) in enumerate(zip(refeeds, drafts, strict=True)):
        parts = [mx.array(f, dtype=mx.uint32)] if f else []
        parts.append(x[r:r + 1])
        if d is not None:
            parts.append(d)
        if lengths[r] < width:
            parts.append(mx.zeros((width - lengths[r],), dtype=mx.uint32))
        rows.append(mx.concatenate(parts))
    return mx.stack(rows), lengths


def _processed(batch: Any, logits: mx.array, x: mx.array) -> mx.array:
    """Rows with logits processors (they carry no drafts: their one real position is
    the first) processed as mlx-lm's step does, over the row's token context."""
    import mlx.core as mx

    per_row = batch.logits_processors or []
    if not any(per_row):
        return logits
    out = []
    for r in range(logits.shape[0]):
        processors = per_row[r] or ()
        if not processors:
            out.append(logits[r])
            continue
        context = batch._token_context[r].update_and_fetch(x[r:r + 1])
        first = logits[r, :1]
        for processor in processors:
            first = processor(context, first)
        out.append(mx.concatenate([first, logits[r, 1:]]))
    return mx.stack(out)


def _restore_rows(recurrent: list[Any], snapshot: list[list[Any]], rows: list[bool]) -> None:
    """Put the state from before the window back in the ``rows`` marked."""
    import mlx.core as mx

    mask = mx.array(rows)
    for c, saved in zip(recurrent, snapshot, strict=True):
        for i, (old, new) in enumerate(zip(saved, c.cache, strict=True)):
            if new is None:
                continue
            before = mx.zeros_like(new) if old is None else old
            c.cache[i] = mx.where(mask.reshape((-1,) + (1,) * (new.ndim - 1)), before, new)


def _ints(tokens: mx.array | None) -> list[int]:
    assert tokens is not None
    return cast("list[int]", tokens.reshape(-1).tolist())
