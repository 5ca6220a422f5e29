"""Prompt-lookup speculation on the batch lane: every row proposes its own drafts, rows
without one decode normally, all in the same forward pass.

mlx-lm's ``BatchKVCache`` shares one write index across rows, so a step feeds every row a
window of the same width ``W``: ``[x, drafts..., padding]`` (``x`` the row's pending
token). Afterwards row ``r`` keeps ``1 + accepted_r`` positions and drops the rest. The
cache is trimmed by what every row drops; a row that drops more has its KV shifted right
by the difference, which turns its dropped tail into left padding (the cache's own
per-row padding, masked already). Positions and RoPE stay exact: a row's offset counts
only its real tokens. The shift copies the rows' KV once per speculative step, which is
why a step only carries drafts when some row's drafts are landing (the same free check
as the lone stream's: its lookups guessed the tokens actually sampled, twice in a row);
otherwise the batch takes mlx-lm's own pipelined step untouched.

:class:`BatchSpeculator` is the lane's side: it keeps each row's lookup, decides per step,
and runs a speculative step in place of ``GenerationBatch.next`` (same responses, several
per row). Batches whose caches are not plain ``BatchKVCache`` (sliding windows, recurrent
layers, quantized KV) or whose rows carry logits processors take plain steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .config import HIT_STREAK, SpecConfig
from .lookup import PromptLookup
from .stream import SpecTally

if TYPE_CHECKING:
    import mlx.core as mx


@dataclass
class _Row:
    lookup: PromptLookup
    config: SpecConfig
    usage: dict[str, int]
    proposal: list[int] = field(default_factory=list)
    streak: int = 0  # tokens in a row its lookup guessed right

    @property
    def hot(self) -> bool:
        return self.streak >= HIT_STREAK


class BatchSpeculator:
    """Per-row prompt lookup for a batch lane's rows (by BatchGenerator uid)."""

    def __init__(self, tally: SpecTally | None = None, extra_positions: int | None = None):
        self.rows: dict[int, _Row] = {}
        self.tally = tally
        # padded positions a speculative step may add over a plain one (all rows together)
        self.extra_positions = (default_extra_positions() if extra_positions is None
                                else extra_positions)

    def add(self, uid: int, config: SpecConfig, history: list[int], usage: Any) -> None:
        """Track row ``uid`` (``history``: every token before its pending one)."""
        if usage.speculation is None:
            usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
            if self.tally is not None:
                self.tally.requests += 1
        row = _Row(PromptLookup(history, config.ngram_max, config.ngram_min), config,
                   usage.speculation)
        row.proposal = row.lookup.propose(config.num_draft_tokens + 1)
        self.rows[uid] = row

    def drop(self, uid: int) -> None:
        self.rows.pop(uid, None)

    def retain(self, uids: Any) -> None:
        """Forget rows that left the batch some other way (the lone-stream hand-off)."""
        for uid in [u for u in self.rows if u not in uids]:
            del self.rows[uid]

    def observe(self, uid: int, token: int) -> None:
        """A token the row emitted: the free check of its last lookup, then the next."""
        row = self.rows.get(uid)
        if row is None:
            return
        hit = bool(row.proposal) and row.proposal[0] == token
        row.streak = row.streak + 1 if hit else 0
        row.lookup.extend([token])
        row.proposal = row.lookup.propose(row.config.num_draft_tokens + 1)

    def stepped(self, uids: set[int]) -> None:
        """Rows that took part in a forward pass (``targetCalls``)."""
        for uid in uids:
            row = self.rows.get(uid)
            if row is not None:
                row.usage["targetCalls"] += 1
        if self.tally is not None and uids:
            self.tally.target_calls += 1

    def drafts(self, batch: Any) -> list[list[int]] | None:
        """Each row's drafts for the next step of ``batch`` (a GenerationBatch), or None
        when no row has any worth sending, or the batch cannot take them. The window is as
        wide as the longest hot row's drafts, within ``extra_positions`` padded positions
        for the whole batch; other rows fill the width with whatever their lookup has
        (those positions are computed anyway)."""
        rows = [self.rows.get(uid) for uid in batch.uids]
        hot = [len(r.proposal) - 1 for r in rows if r is not None and r.hot
               and len(r.proposal) > 1]
        if not hot or not _plain_caches(batch.prompt_cache) or any(batch.logits_processors):
            return None
        room = max(1, self.extra_positions // max(1, len(rows)))
        width = min(max(hot), room, *(r.config.num_draft_tokens for r in rows if r))
        return [r.proposal[1:1 + width] if r is not None else [] for r in rows]

    @contextmanager
    def turn(self, gen: Any,
             before: Callable[[list[int]], None] | None = None) -> Iterator[None]:
        """Around one BatchGenerator turn: its decode step verifies drafts when some row
        has drafts worth sending (its prefill part runs as always). ``before(uids)`` runs
        ahead of that forward pass, as it does ahead of the generator's own (the lane's
        per-row adapter routing)."""
        batch: Any = getattr(gen, "_generation_batch", None)
        drafts = self.drafts(batch) if batch is not None and len(batch) else None
        if batch is None or drafts is None:
            yield
            return
        if self.tally is not None:
            self.tally.batch_steps += 1
        def verify() -> list[Any]:
            if before is not None:
                before(list(batch.uids))
            return verify_step(batch, drafts, self._count)

        batch.next = verify  # this turn only
        try:
            yield
        finally:
            del batch.next

    def _count(self, uid: int, drafted: int, accepted: int) -> None:
        row = self.rows.get(uid)
        if row is not None:
            row.usage["drafted"] += drafted
            row.usage["accepted"] += accepted
        if self.tally is not None:
            self.tally.drafted += drafted
            self.tally.accepted += accepted
            self.tally.rounds += 1 if drafted else 0


def default_extra_positions() -> int:
    """``MLXBUN_SPEC_BATCH_POSITIONS``, else by backend. A GPU step is bound by reading the
    weights, so some extra draft positions ride along nearly free; measured on an H200 (8B
    bf16, 8 rows, paired rounds), 32 (4 drafts a row) gave 1.35x plain batched decoding
    where 96 and 256 (10 a row) gave 1.04-1.06x: a wider window mostly pays for drafts that
    are rejected. A CPU step is compute-bound from the start."""
    import os

    import mlx.core as mx

    env = os.environ.get("MLXBUN_SPEC_BATCH_POSITIONS")
    if env:
        return max(1, int(env))
    return 32 if mx.default_device() == mx.gpu else 16


def _plain_caches(cache: list[Any]) -> bool:
    from mlx_lm.models.cache import BatchKVCache

    return bool(cache) and all(type(c) is BatchKVCache for c in cache)


def verify_step(batch: Any, drafts: list[list[int]], count: Any) -> list[Any]:
    """Feed every row ``[pending, *drafts]`` (padded to one width), accept each row's
    drafts while they equal its samples, roll the cache back per row, and answer as
    ``GenerationBatch.next`` would: a response per emitted token, in order."""
    import mlx.core as mx
    import numpy as np

    rows, width = len(batch.uids), 1 + max(len(d) for d in drafts)
    pad = np.zeros((rows, width - 1), dtype=np.uint32)
    for r, d in enumerate(drafts):
        pad[r, :len(d)] = d
    x = batch._next_tokens.astype(mx.uint32)
    window = mx.concatenate([x[:, None], mx.array(pad)], axis=1)
    logits = batch.model(window, cache=batch.prompt_cache)  # (B, W, V)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    samples = _sample(batch, logprobs)
    mx.eval(x, samples)
    xs, sampled = cast("list[int]", x.tolist()), cast("list[list[int]]", samples.tolist())
    accepted = []
    for r, d in enumerate(drafts):
        a = 0
        while a < len(d) and sampled[r][a] == d[a]:
            a += 1
        accepted.append(a)
        count(batch.uids[r], len(d), a)
    _rollback(batch.prompt_cache, [width - 1 - a for a in accepted])
    previous = batch._next_logprobs
    batch._next_tokens = mx.array([sampled[r][a] for r, a in enumerate(accepted)],
                                  dtype=mx.uint32)
    batch._next_logprobs = [logprobs[r, a] for r, a in enumerate(accepted)]
    return _responses(batch, xs, drafts, accepted, previous, logprobs)


def _sample(batch: Any, logprobs: mx.array) -> mx.array:
    """Every position's sample with its row's sampler (one call when rows share one)."""
    import mlx.core as mx

    rows, width, vocab = logprobs.shape
    samplers = [batch.fallback_sampler if s is None else s
                for s in (batch.samplers or [None] * rows)]
    if all(s is samplers[0] for s in samplers):
        flat: mx.array = samplers[0](logprobs.reshape(rows * width, vocab))
        return flat.reshape(rows, width)
    return mx.stack([s(logprobs[r]) for r, s in enumerate(samplers)])


def _rollback(cache: list[Any], drop: list[int]) -> None:
    """Drop the last ``drop[r]`` positions of each row: trim what all rows drop, shift
    the rest of each row's tail into its left padding."""
    import mlx.core as mx

    common = min(drop)
    shifts = [d - common for d in drop]
    shift = mx.array(shifts, dtype=mx.int32)
    # the gather indices depend only on the write index and the KV shape, which every
    # layer of a plain model shares: built once a step, not once a layer
    indices: dict[tuple[int, ...], mx.array] = {}

    def moved(a: mx.array, idx: int) -> mx.array:
        shape = (a.shape[0], a.shape[1], idx, a.shape[3])
        if shape not in indices:
            pos = mx.maximum(mx.arange(idx, dtype=mx.int32)[None, :] - shift[:, None], 0)
            indices[shape] = mx.broadcast_to(pos[:, None, :, None], shape)
        return mx.take_along_axis(a[..., :idx, :], indices[shape], axis=2)

    for c in cache:
        if common:
            c.trim(common)
        if not any(shifts):
            continue
        idx = c._idx
        c.keys[..., :idx, :] = moved(c.keys, idx)
        c.values[..., :idx, :] = moved(c.values, idx)
        c.left_padding = c.left_padding + shift
        c.offset = c.offset - shift


def _responses(batch: Any, xs: list[int], drafts: list[list[int]], accepted: list[int],
               previous: list[Any], logprobs: mx.array, offsets: list[int] | None = None,
               cached: list[list[int]] | None = None) -> list[Any]:
    """GenerationBatch.next's bookkeeping for several tokens per row: the tokens in the
    cache, the token budgets, stop sequences, finished rows' caches, the filter.
    ``offsets``: where each row's pending token sits in its window (after tokens fed
    again); ``cached``: the tokens each row's cache took (default: those emitted)."""
    responses, keep = [], []
    response = type(batch).Response
    for r in range(len(batch.uids)):
        at = offsets[r] if offsets is not None else 0
        emitted = [(xs[r], previous[r])]
        emitted += [(drafts[r][j], logprobs[r, at + j]) for j in range(accepted[r])]
        batch.tokens[r].extend([t for t, _ in emitted] if cached is None else cached[r])
        finish = None
        for token, lp in emitted:
            batch._num_tokens[r] += 1
            if batch._num_tokens[r] >= batch.max_tokens[r]:
                finish = "length"
            if batch._matchers[r].advance(token):
                finish = "stop"
            if finish is not None:
                responses.append(response(batch.uids[r], token, lp, finish,
                                          batch.extract_cache(r), batch.tokens[r]))
                break
            responses.append(response(batch.uids[r], token, lp, None, None, None))
        if finish is None:
            keep.append(r)
    if len(keep) < len(batch.uids):
        batch.filter(keep)
    return responses
