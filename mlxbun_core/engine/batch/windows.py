"""A decode step in which rows feed windows: a grammar's forced run and speculative
drafts ride in the same forward pass as every row's next token.

Row ``r`` feeds ``[*refeed, x, *forced, *drafts]`` (``x`` its next token), padded to
the longest window. Forced tokens are kept as they are (the grammar allowed nothing
else); drafts are kept while each equals the row's own sample at the position before
it, and the first sample that differs (or the one after the last draft) becomes the
row's next token. A row keeps ``1 + len(forced) + accepted`` positions: its block
table's length says so and the positions past it are simply written over later (the
paged layout needs no per-row roll or copy to take a rejected draft back).

Recurrent layers (``ArraysCache``: gated DeltaNet) cannot take positions back. Their
states are copied (by reference: arrays are immutable) before a window with drafts; a
row that rejected a draft gets its state from before the window back (a per-row
select; both are ``states.StateOps``, which a distributed follower replays), keeps
none of the window's positions, and feeds its kept tokens again ahead of its next
window (``refeed``: already handed out, so only fed). A row carrying
:func:`refeed_cap` such tokens sends no drafts until they are fed (a window without
drafts cannot be rejected). Padding is masked out of the state by
``ArraysCache.prepare(lengths=...)``.

Drafts come from the host (a lookup's list: guessed before ``x`` is known, the lane
passes what follows it; an MTP head's walked under a row's logits processors) or from
the device (an MTP head's, computed from ``x`` and the hidden states without a host
read): either way they are written into the window's
inputs on the device, and read back with the samples in the step's one wait. A forced
run is computed from ``x`` itself, so a step with a forcing row reads every ``x`` on
the host first. Tapped rows (an MTP head's) get the hidden states of the positions
they kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx
import numpy as np

from ...runconfig import current
from ..speculate.stream import grammar_of
from .rows import Drafts, Emit, Forcing, Row

Batch = Any  # the executor's ``Batch``: it imports this module, so this one cannot import it

if TYPE_CHECKING:
    from collections.abc import Sequence


GPU_REFEED, CPU_REFEED = 4, 1


def refeed_cap() -> int:
    """Refed tokens a row may carry and still draft: ``MLXBUN_SPEC_BATCH_REFEED``, else 4
    on a GPU and 1 on the CPU. Every row of a step pays for the widest window. A GPU step
    is bound by reading the weights, so refed tokens ride along with the next drafts
    nearly free; a CPU step pays for every position, and a rejected row then does better
    to feed its kept tokens with its next token alone (simulated at a per-draft
    acceptance p, two drafts: tokens per fed position 0.40 vs 0.22 at p = 0, 0.58 vs 0.45
    at 0.6; tokens per step 1.59 vs 1.85 at 0.6)."""
    set_to = current().speculation.batch_refeed
    if set_to is not None:
        return set_to
    return GPU_REFEED if mx.default_device() == mx.gpu else CPU_REFEED

Plan = tuple[list[int], "Sequence[int] | mx.array"]
"""A row's ``(forced, drafts)`` in one window."""


def window_step(b: Batch, drafts: Drafts, forcing: Forcing | None) -> list[Emit]:
    assert b.next_tokens is not None
    rows = [b.rows[u] for u in b.decoding]
    forced = _forced(b, forcing) if forcing is not None else {}
    cap = refeed_cap()
    plans = [_bounded(r, forced.get(r.uid, []), drafts.get(r.uid, ()), cap) for r in rows]
    plans = _guided(b, rows, plans, drafts, cap)
    if not any(f or len(d) or r.refeed for r, (f, d) in zip(rows, plans)):
        return cast("list[Emit]", b.decode())  # nothing rides along: the ordinary step
    lead = [len(r.refeed) for r in rows]  # each row's x sits after its refed tokens
    valid = [n + 1 + len(f) + len(d) for n, (f, d) in zip(lead, plans)]
    inputs = _inputs(b.next_tokens, rows, plans, max(valid))
    # recurrent states before the window (arrays are immutable: a copy holds references)
    ops = b.layout.state_ops
    held = [ops.copy(c) for c in b.states.caches] if any(len(d) for _, d in plans) else []
    logits, hidden = _run(b, rows, inputs, valid)
    # the positions each row samples at: after its forced run, one per draft and one more
    at = [[n + len(f) + j for j in range(len(d) + 1)] for n, (f, d) in zip(lead, plans)]
    picked = logits[mx.array([r for r, a in enumerate(at) for _ in a]),
                    mx.array([j for a in at for j in a])]
    picked = _processed(rows, inputs, valid, at, picked)
    logprobs = picked - mx.logsumexp(picked, axis=-1, keepdims=True)
    samples = _sample(logprobs, rows, at)
    mx.eval(samples, logprobs, inputs, *([] if b.tap is None else b.tap.arrays()))
    fed = cast("list[list[int]]", inputs.tolist())
    drawn = cast("list[int]", samples.tolist())
    out: list[Emit] = []
    nxt, nxt_lp, back, k = [], [], [], 0
    for i, (r, lp, (f, d), a) in enumerate(zip(rows, b.next_logprobs, plans, at)):
        x, guesses = fed[i][lead[i]], fed[i][lead[i] + 1 + len(f):valid[i]]
        mine = drawn[k:k + len(a)]
        accepted = 0
        while accepted < len(d) and mine[accepted] == guesses[accepted]:
            accepted += 1
        kept = [x, *f, *guesses[:accepted]]
        grammar = grammar_of(list(r.processors)) if r.processors else None
        if grammar is not None and accepted < len(d):  # rejected drafts leave its grammar
            grammar.rollback(len(d) - accepted)
        back.append(bool(held) and accepted < len(d))  # (held: recurrent layers, drafts)
        _keep(r, kept, back[-1])
        if r.tapped and hidden is not None and b.tap is not None:
            b.tap.kept(r.uid, hidden[i:i + 1, lead[i]:lead[i] + len(kept)], kept)
        nxt.append(mine[accepted])
        nxt_lp.append(logprobs[k + accepted])
        out += _emits(r, x, lp, f, guesses, accepted, logprobs[k:k + accepted])
        k += len(a)
    if any(back):
        for c, saved in zip(b.states.caches, held, strict=True):
            ops.restore(c, saved, back)
    b.next_tokens = mx.array(nxt, dtype=mx.uint32)
    b.next_logprobs = list(nxt_lp)
    return out


def _run(b: Batch, rows: list[Row], inputs: mx.array, valid: list[int]
         ) -> tuple[mx.array, mx.array | None]:
    """The window's forward: logits (and hidden states when a row is tapped); padding
    is written to the trash block and kept out of the recurrent states."""
    width = int(inputs.shape[1])
    b.reserve(rows, valid)
    states = b.states.caches
    padded = any(v < width for v in valid)
    ops = b.layout.state_ops
    if padded:
        for c in states:
            ops.prepare(c, valid)
    logits, hidden = b.run_pass(inputs, rows, valid, states)
    if padded:
        for c in states:
            ops.finalize(c)
    return logits, hidden


def _forced(b: Batch, forcing: Forcing) -> dict[int, list[int]]:
    """The forced runs of rows whose next token was sampled (read on the host here)."""
    assert b.next_tokens is not None
    tokens = cast("list[int]", b.next_tokens.tolist())
    uids = b.decoding
    asked = [i for i, lp in enumerate(b.next_logprobs) if lp is not None]
    return forcing([uids[i] for i in asked], [tokens[i] for i in asked]) if asked else {}


def _bounded(row: Row, forced: list[int], drafts: Sequence[int] | mx.array,
             cap: int) -> Plan:
    """``(forced, drafts)`` within what ``row`` can take: no drafts for rows with logits
    processors (:func:`_guided` gives their host drafts back) or carrying
    ``cap`` refed tokens; nothing past the row's token budget."""
    room = max(0, row.budget - 1)
    forced = forced[:room]
    if row.processors or len(row.refeed) >= cap:
        return forced, []
    return forced, drafts[:max(0, room - len(forced))]


def _guided(b: Batch, rows: list[Row], plans: list[Plan], drafts: Drafts, cap: int
            ) -> list[Plan]:
    """Host drafts (prompt lookup's, an MTP head's walked under the row's processors) for
    rows with logits processors: every position is processed in the verify pass; under a
    grammar only the prefix the matcher allows after the row's tokens (refed ones too),
    next input and forced run (read on the host here). None where the guess did not start
    with that run or the row carries ``cap`` refed tokens."""
    asked = [i for i, r in enumerate(rows) if r.processors and len(r.refeed) < cap
             and len(drafts.get(r.uid, ())) and not isinstance(drafts[r.uid], mx.array)]
    if not asked:
        return plans
    xs = cast("list[int]", b.next_tokens.tolist())
    out = list(plans)
    for i in asked:
        r, (f, _) = rows[i], plans[i]
        guess = list(cast("Sequence[int]", drafts[r.uid]))
        if guess[:len(f)] != f:
            continue
        d = guess[len(f):][:max(0, r.budget - 1 - len(f))]
        g = grammar_of(list(r.processors))
        n = len(d) if g is None else g.draft_prefix([*r.tokens, *r.refeed, xs[i], *f], d)
        out[i] = (f, d[:n])
    return out


def _inputs(x: mx.array, rows: list[Row], plans: list[Plan], width: int) -> mx.array:
    """``(rows, width)``: every row's ``[*refeed, x, *forced, *drafts]`` and padding. The
    host's tokens in one array, ``x`` placed by a select, device drafts by a scatter
    (rows with drafts of one length in one)."""
    grid = np.zeros((len(rows), width), dtype=np.uint32)
    x_at = np.zeros((len(rows), width), dtype=bool)
    device: dict[int, list[tuple[int, mx.array]]] = {}  # length -> (flat start, drafts)
    for i, (r, (f, d)) in enumerate(zip(rows, plans)):
        n = len(r.refeed)
        grid[i, :n] = r.refeed
        x_at[i, n] = True
        grid[i, n + 1:n + 1 + len(f)] = f
        start = n + 1 + len(f)
        if isinstance(d, mx.array):
            if d.size:
                device.setdefault(int(d.size), []).append((i * width + start, d))
        else:
            grid[i, start:start + len(d)] = d
    out = mx.where(mx.array(x_at), x.astype(mx.uint32)[:, None], mx.array(grid))
    if device:
        flat = out.reshape(-1)
        for size, group in device.items():
            at = mx.array([s + j for s, _ in group for j in range(size)])
            flat[at] = mx.concatenate([d.reshape(-1).astype(mx.uint32) for _, d in group])
        out = flat.reshape(len(rows), width)
    return out


def _keep(row: Row, kept: list[int], back: bool) -> None:
    """Settle ``row`` after its window: ``kept`` (its next input, forced run and accepted
    drafts) joins its KV after the refed tokens, or, rolled back (``back``), is fed again
    with them."""
    if back:
        row.refeed += kept
        return
    kept = [*row.refeed, *kept]
    row.refeed = []
    row.tokens += kept
    row.table.length += len(kept)
    if row.processors:  # forced runs, and a grammar row's checked drafts (_guided)
        row.context = _extend(row.context, mx.array(kept))


def _processed(rows: list[Row], inputs: mx.array, valid: list[int], at: list[list[int]],
               logits: mx.array) -> mx.array:
    """Rows' logits processors at their one sampling position, over every token they
    were fed including this window."""
    if not any(r.processors for r in rows):
        return logits
    parts, k = [], 0
    for i, (r, a) in enumerate(zip(rows, at)):
        x = logits[k:k + len(a)]
        if r.processors:  # one position after a forced run, or one per draft (in order)
            ends = [valid[i]] if len(a) == 1 else [p + 1 for p in a]
            for j, end in enumerate(ends):
                context = _extend(r.context, inputs[i, :end])
                y = x[j:j + 1]
                for proc in r.processors:
                    y = proc(context, y)
                parts.append(y)
        else:
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


def _emits(row: Row, token: int, logprobs: mx.array | None, forced: list[int],
           drafts: list[int], accepted: int, draft_logprobs: mx.array) -> list[Emit]:
    """What the step hands out for ``row``: its token with the forced run, then each
    accepted draft (the row's budget already bounded them). A token without
    ``logprobs`` was handed out before (a prompt's last, or the last token of a lone
    stream that joined the batch): only its accepted drafts go out, the first of them
    with the draft counts."""
    out = [] if logprobs is None else [Emit(row.uid, token, logprobs, forced=list(forced))]
    out += [Emit(row.uid, d, draft_logprobs[j]) for j, d in enumerate(drafts[:accepted])]
    if not out:
        return out
    out[0].drafted, out[0].accepted = len(drafts), accepted
    row.budget -= len(out) + len(forced)
    if row.budget <= 0:
        out[-1].finish = "length"
    return out


def _extend(context: mx.array | None, tokens: mx.array) -> mx.array:
    return tokens if context is None else mx.concatenate([context, tokens])
