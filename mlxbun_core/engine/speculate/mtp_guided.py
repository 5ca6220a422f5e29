"""MTP drafts for batch rows that carry logits processors (a grammar, ``logit_bias``,
penalties): the head's guesses are walked on the host, one head call per depth for all
such rows together.

At each depth every row's head logits go through its own processors (all but the
grammar, over the row's context with its guesses so far) and then its grammar's mask
(:meth:`~mlxbun_core.grammar.base.GrammarProcessor.mask_guess`: what the matcher allows
now, EOS left out); the row's sampler picks the guess and the matcher takes it
(``try_draft``). A refused guess, or one after which only EOS may follow, ends that
row's draft, as ``guided.walk`` does on the serial lane. The chained positions leave the
heads and the guesses leave the matchers afterwards: the window step checks the drafts
against the grammar again (``batch/windows.py``: ``_guided``), verifies each position
with the row's processors and rolls rejected ones back out of the matcher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .stream import grammar_of

if TYPE_CHECKING:
    import mlx.core as mx

    from ...contract import Sampler
    from ...grammar.base import GrammarProcessor
    from ..batch.rows import Row
    from .mtp_head import HeadPages

SampleFn = Callable[[list["Sampler | None"], "mx.array"], "mx.array"]


@dataclass
class _Walk:
    row: Row
    x: int  # the row's next input (read on the host)
    depth: int  # the most guesses it may take
    sampler: Sampler | None
    grammar: GrammarProcessor | None
    others: list[Any]  # its processors but the grammar
    guesses: list[int] = field(default_factory=list)


def guided_drafts(pages: HeadPages, uids: list[int], walks: list[_Walk], logits: mx.array,
                  state: mx.array, sample: SampleFn) -> dict[int, list[int]]:
    """Each row's guesses (host tokens), ``logits``/``state``: the head's output after
    the rows' next inputs (row ``j`` of each is ``uids[j]``'s)."""
    import mlx.core as mx

    live = [j for j, w in enumerate(walks) if w.depth > 0]
    lengths = [pages.length(u) for u in uids]
    chained = False
    at = {j: j for j in live}  # a live row's index into logits/state
    while live:
        ys = [_processed(walks[j], logits[at[j]].reshape(1, -1)) for j in live]
        tokens = cast("list[int]", sample([walks[j].sampler for j in live],
                                          mx.concatenate(ys)).tolist())
        going = []
        for j, t in zip(live, tokens):
            w = walks[j]
            if w.grammar is not None and not w.grammar.try_draft(t):
                continue
            w.guesses.append(t)
            if len(w.guesses) < w.depth:
                going.append(j)
        if not going:
            break
        pick = mx.array([at[j] for j in going])
        last = mx.array([[walks[j].guesses[-1]] for j in going], dtype=mx.uint32)
        logits, state = pages.append([uids[j] for j in going], state[pick][:, -1:], last,
                                     [1] * len(going))
        at = {j: k for k, j in enumerate(going)}
        live, chained = going, True
    if chained:
        pages.rewind(uids, lengths)
    for w in walks:
        if w.grammar is not None and w.depth > 0:
            w.grammar.matcher.rollback(1 + len(w.guesses))  # (and the next input)
    return {u: w.guesses for u, w in zip(uids, walks) if w.guesses}


def walks_for(rows: list[Row], xs: list[int], depths: list[int],
              samplers: list[Sampler | None]) -> list[_Walk]:
    """A walk per row; a grammar that no longer tracks the reply (thinking, failed,
    closing on a budget) drafts nothing. The matcher takes the row's next input ``xs[j]``
    for the walk only: the step consumes it (a fill session's forced run after it first),
    and the walk's guesses begin with that run where the grammar forces one."""
    walks = []
    for row, x, depth, sampler in zip(rows, xs, depths, samplers):
        g = grammar_of(list(row.processors))
        if g is not None and depth > 0 and not (g.catch_up([*row.tokens, *row.refeed])
                                                and g.matcher.try_token(x)):
            depth = 0
        others = [p for p in row.processors if p is not g]
        walks.append(_Walk(row, x, depth, sampler, g, others))
    return walks


def _processed(w: _Walk, logits: mx.array) -> mx.array:
    """A guess's logits under the row's processors and its grammar's mask."""
    import mlx.core as mx

    if w.others:
        fed = mx.array([*w.row.refeed, w.x, *w.guesses])
        context = fed if w.row.context is None else mx.concatenate([w.row.context, fed])
        for p in w.others:
            logits = p(context, logits)
    if w.grammar is not None:
        logits = w.grammar.mask_guess(logits)
    return logits
