"""A decode step in which rows feed windows: a grammar's forced run and speculative
drafts ride in the same forward pass as every row's next token.

Row ``r`` feeds ``[x, *forced, *drafts]`` (``x`` its next token), padded to the
longest window. Forced tokens are kept as they are (the grammar allowed nothing
else); drafts are kept while each equals the row's own sample at the position before
it, and the first sample that differs (or the one after the last draft) becomes the
row's next token. A row keeps ``1 + len(forced) + accepted`` positions: its block
table's length says so and the positions past it are simply written over later (the
paged layout needs no per-row roll or copy to take a rejected draft back). Recurrent
layers cannot take positions back, so in a model with them rows get no drafts (forced
runs are fine: every one of their positions is kept, and padding is masked out of the
state by ``ArraysCache.prepare(lengths=...)``).

Drafts are guessed before ``x`` is known (a lookup proposes ``x`` and what follows;
the lane passes what follows), so a window of drafts is built from ``x`` still on the
device and the step waits only to verify. A forced run is computed from ``x`` itself,
so a step with a forcing row reads every ``x`` on the host first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import mlx.core as mx

if TYPE_CHECKING:
    from .executor import Batch, Emit, Forcing, Row


def window_step(b: Batch, drafts: dict[int, list[int]], forcing: Forcing | None
                ) -> list[Emit]:
    assert b._next is not None
    uids = list(b.decoding)
    rows = [b.rows[u] for u in uids]
    fed_logprobs = b._next_logprobs
    tokens: list[int] | None = None
    forced: dict[int, list[int]] = {}
    if forcing is not None:
        tokens = cast("list[int]", b._next.tolist())
        asked = [i for i, lp in enumerate(fed_logprobs) if lp is not None]
        if asked:
            forced = forcing([uids[i] for i in asked], [tokens[i] for i in asked])
    plans = [_bounded(r, forced.get(r.uid, []), drafts.get(r.uid, []),
                      bool(b.layout.recurrent)) for r in rows]
    if not any(f or d for f, d in plans):
        return b.decode()  # nothing rides along: the ordinary step
    extra = [f + d for f, d in plans]
    valid = [1 + len(e) for e in extra]
    width = max(valid)
    tail = mx.array([e + [0] * (width - 1 - len(e)) for e in extra], dtype=mx.uint32)
    inputs = mx.concatenate([b._next[:, None].astype(mx.uint32), tail], axis=1)
    b._reserve(rows, valid)
    states = b.states.caches
    padded = any(v < width for v in valid)
    if padded:
        for c in states:
            c.prepare(lengths=valid)
    logits = b._pass(rows, inputs, valid, width, states)
    if padded:
        for c in states:
            c.finalize()
    # the positions each row samples at: after its forced run, one per draft and one more
    at = [[len(f) + j for j in range(len(d) + 1)] for f, d in plans]
    picked = logits[mx.array([r for r, a in enumerate(at) for _ in a]),
                    mx.array([j for a in at for j in a])]
    picked = _processed(rows, inputs, valid, at, picked)
    logprobs = picked - mx.logsumexp(picked, axis=-1, keepdims=True)
    samples = _sample(logprobs, rows, at)
    mx.eval(samples, logprobs, inputs)
    drawn = cast("list[int]", samples.tolist())
    xs = tokens if tokens is not None else cast("list[int]", inputs[:, 0].tolist())
    out: list[Emit] = []
    nxt, nxt_lp, k = [], [], 0
    for r, x, lp, (f, d), a in zip(rows, xs, fed_logprobs, plans, at):
        mine = drawn[k:k + len(a)]
        accepted = 0
        while accepted < len(d) and mine[accepted] == d[accepted]:
            accepted += 1
        kept = [x, *f, *d[:accepted]]
        r.tokens += kept
        r.table.length += len(kept)
        if r.processors:  # only forced runs reach rows with processors (see _bounded)
            r.context = _extend(r.context, mx.array(kept))
        nxt.append(mine[accepted])
        nxt_lp.append(logprobs[k + accepted])
        if lp is not None:
            out += _emits(r, x, lp, f, d, accepted, logprobs[k:k + accepted])
        k += len(a)
    b._next = mx.array(nxt, dtype=mx.uint32)
    b._next_logprobs = list(nxt_lp)
    return out


def _bounded(row: Row, forced: list[int], drafts: list[int],
             recurrent: bool) -> tuple[list[int], list[int]]:
    """``(forced, drafts)`` within what ``row`` can take: no drafts for rows with logits
    processors (they would need a processor call per position) or in models with
    recurrent layers; nothing past the row's token budget."""
    room = max(0, row.budget - 1)
    forced = forced[:room]
    return forced, ([] if row.processors or recurrent else drafts[:room - len(forced)])


def _processed(rows: list[Row], inputs: mx.array, valid: list[int], at: list[list[int]],
               logits: mx.array) -> mx.array:
    """Rows' logits processors at their one sampling position, over every token they
    were fed including this window."""
    if not any(r.processors for r in rows):
        return logits
    parts, k = [], 0
    for i, (r, a) in enumerate(zip(rows, at)):
        x = logits[k:k + len(a)]
        if r.processors:
            context = _extend(r.context, inputs[i, :valid[i]])
            for proc in r.processors:
                x = proc(context, x)
        parts.append(x)
        k += len(a)
    return mx.concatenate(parts, axis=0)


def _sample(logprobs: mx.array, rows: list[Row], at: list[list[int]]) -> mx.array:
    """Every sampling position's token with its row's sampler (one call when rows
    share one; None samples greedily)."""
    samplers = [r.sampler for r in rows]
    first = samplers[0]
    if all(s is first for s in samplers):
        return mx.argmax(logprobs, axis=-1) if first is None else first(logprobs)
    parts, k = [], 0
    for s, a in zip(samplers, at):
        x = logprobs[k:k + len(a)]
        parts.append(mx.argmax(x, axis=-1) if s is None else s(x))
        k += len(a)
    return mx.concatenate(parts)


def _emits(row: Row, token: int, logprobs: mx.array, forced: list[int], drafts: list[int],
           accepted: int, draft_logprobs: mx.array) -> list[Emit]:
    """What the step hands out for ``row``: its token with the forced run, then each
    accepted draft (the row's budget already bounded them)."""
    from .executor import Emit

    out = [Emit(row.uid, token, logprobs, forced=list(forced), drafted=len(drafts),
                accepted=accepted)]
    out += [Emit(row.uid, d, draft_logprobs[j]) for j, d in enumerate(drafts[:accepted])]
    row.budget -= 1 + len(forced) + accepted
    if row.budget <= 0:
        out[-1].finish = "length"
    return out


def _extend(context: mx.array | None, tokens: mx.array) -> mx.array:
    return tokens if context is None else mx.concatenate([context, tokens])

