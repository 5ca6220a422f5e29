"""The batch's executor: rows, their KV in the block pool, and the two kinds of pass
(a prefill chunk for rows reading their prompt, a decode step for the rest).

It calls mlx-lm only through public API: the model's ``__call__(inputs, cache=...)``
with a cache object per layer (``view.PagedLayer`` for attention, mlx-lm's own
``ArraysCache`` batch for recurrent layers), mlx-lm samplers and logits processors.
What runs when is decided elsewhere (the lane's plan); this module only runs it.

A decode step is pipelined like mlx-lm's ``generate_step``: the step feeds every row
the token sampled in the previous step (still on the device), queues the next forward
pass and its sampling, and only then reads the fed tokens back to hand them out. So
the device never waits for the host between steps.

A row's prompt is read in chunks except its last token, which its first decode step
feeds (the KV of the prompt minus its last token is what the prefix cache keeps for
caches that cannot rewind).

Rows added with ``tapped=True`` draft with the model's own multi-token-prediction head,
which reads the target's hidden states: a pass carrying one runs through the batch's
:class:`Tap` (the head's ``forward``: logits and states) and hands each such row its
states (``speculate/mtp_batch.py``).

Under a KV scheme (``--kv-quant``) full-attention layers keep quantized blocks
(``quantized.py``); rows holding no KV yet attend as mlx-lm's first pass does, in a pass
apart from rows holding some.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx

from ...kvquant import OFF, KVScheme
from ..stages import Laps
from . import states as recurrent
from .entry import BlockEntry, Shared
from .layout import Layout, Slot
from .pool import BlockPool, BlockTable, OutOfBlocks
from .rows import Drafts, Emit, Forcing, Row, Tap
from .sampling import extended, processed, sample
from .view import Window
from .windows import window_step

if TYPE_CHECKING:
    from .journal import Journal

Forward = Callable[[mx.array, list[Any]], mx.array]
"""A forward pass: ``(inputs (rows, width), caches) -> logits (rows, width, vocab)``."""


class Batch:
    """Rows of one model over ``pool``. ``before(uids)`` runs ahead of every forward
    pass with the rows it carries, in order (per-row adapter routing); ``tap`` reads the
    hidden states of rows added with ``tapped=True``; ``kv``: the KV scheme the blocks
    keep (``--kv-quant``); ``journal`` records what the passes change, for distributed
    followers (``journal.py``)."""

    def __init__(self, model: Any, slots: list[Slot], pool: BlockPool,
                 before: Callable[[list[int]], None] | None = None,
                 reclaim: Callable[[int], int] | None = None, tap: Tap | None = None,
                 kv: KVScheme = OFF, journal: Journal | None = None):
        if tap is not None and journal is not None:  # its forward is not the model's call
            raise ValueError("an MTP tap's passes cannot be replayed by the other ranks")
        self.model = model
        self.tap = tap
        self.layout = Layout(slots, pool, kv, journal)
        self.pool = pool
        self.before = before
        # frees blocks others hold (the prefix cache's entries) when the pool runs short
        self.reclaim = reclaim
        self.rows: dict[int, Row] = {}
        self.decoding: list[int] = []  # uids, in the decode batch's order
        self.states = recurrent.StateBatch(self.layout.state_ops)
        # the decoding rows' next inputs, ``(rows,)`` in ``decoding`` order, on the device
        # (what a drafter reads to guess the tokens after them), and the log-probs of
        # those that were sampled (None: a prompt's last token); a window step
        # (``windows.py``) sets both too
        self.next_tokens: mx.array | None = None
        self.next_logprobs: list[mx.array | None] = []
        self.forward: Forward = self._model_forward
        # a decode pass's forward where a lighter one gives the model's logits (lean.py)
        self.lean: Forward | None = None
        self.direct = False  # short passes hand attention the stores (``direct.py``)
        # called once a pass's graph is built, where MLX allocates when it runs it: a
        # test's injected out-of-memory or device fault (``engine/memory.py``)
        self.fault: Callable[[], None] | None = None
        # traced requests: a step carrying rows' token zero times its stages (stages.py);
        # ``zero`` is the last such step's (rows, laps)
        self.timed = False
        self.zero: tuple[list[int], Laps] | None = None

    # -- rows in and out -------------------------------------------------------------
    def add(self, uid: int, todo: list[int], *, cache: list[Any] | None = None,
            shared: Shared | None = None, held: Sequence[int] = (), sampler: Any = None,
            processors: Sequence[Any] = (), budget: int = 1 << 30, tapped: bool = False,
            refeed: Sequence[int] = (), first: int = 0) -> None:
        """Start row ``uid`` holding ``held``: in ``shared`` (a table over cached blocks,
        taken over by the row), or in ``cache`` (a single-sequence mlx-lm cache, copied
        into the row's blocks), or nowhere (None of them: ``held`` is empty); ``todo``
        (at least one token) is fed next; ``tapped``: the tap reads its states;
        ``refeed``: tokens the cache lacks (a rollback took them out), fed again ahead of a
        one-token ``todo`` without being handed out; ``first``: tokens its first pass
        reads (0: as planned; ``Row.first_kept``)."""
        if not todo:
            raise ValueError("a row needs at least one token to feed")
        if refeed and len(todo) > 1:
            raise ValueError("tokens to feed again come before a row's next token only")
        if tapped and self.tap is None:
            raise ValueError("a tapped row needs a batch with a tap")
        if shared is not None:
            table, states = shared.table, shared.states
        else:
            table = BlockTable(self.pool)
            states = (self._load(table, cache, len(held)) if cache is not None and held
                      else self.layout.fresh_states())
        self.rows[uid] = Row(uid, table, list(held), list(todo), sampler, processors, budget,
                             states, tapped=tapped, refeed=list(refeed), first_cap=first,
                             first=0 if table.length else None)
        if processors and held:  # they see every token fed, those cached before too
            self.rows[uid].context = mx.array(list(held), dtype=mx.uint32)
        if len(todo) == 1:
            self._start_decoding(self.rows[uid])

    def _load(self, table: BlockTable, cache: list[Any], length: int) -> list[Any]:
        try:
            return self.layout.load(table, cache, length)
        except OutOfBlocks:
            self._grow(self.pool.blocks_for(length))
            return self.layout.load(table, cache, length)

    def remove(self, uid: int) -> None:
        """Drop row ``uid`` and give its blocks back."""
        row = self.rows.pop(uid)
        row.table.free()
        if uid in self.decoding:
            keep = [i for i, u in enumerate(self.decoding) if u != uid]
            self.decoding = [self.decoding[i] for i in keep]
            self.states.keep(self.decoding)
            if self.next_tokens is not None:
                self.next_tokens = self.next_tokens[mx.array(keep)] if keep else None
            self.next_logprobs = [self.next_logprobs[i] for i in keep]

    def export(self, uid: int) -> tuple[list[Any], list[int]]:
        """Row ``uid``'s KV as a fresh single-sequence mlx-lm cache, and the tokens it
        holds (the row goes on)."""
        row = self.rows[uid]
        states = self.states.take(uid) if uid in self.decoding else row.states
        out = self.layout.export(row.table, states)
        mx.eval([c.state for c in out])  # holds no lazy read of the pool past now
        return out, list(row.tokens)

    def snapshot(self, uid: int) -> tuple[BlockEntry, list[int]]:
        """Row ``uid``'s KV as a block entry sharing its blocks (the row goes on, and
        copies a shared block before it writes into it), and the tokens it holds."""
        row = self.rows[uid]
        states = self.states.take(uid) if uid in self.decoding else \
            [self.layout.state_ops.copy(s) for s in row.states]
        return BlockEntry(self.layout, row.table.share(row.table.length), states), \
            list(row.tokens)

    def detach(self, uid: int) -> tuple[BlockEntry, list[int]]:
        """Remove row ``uid``, handing its blocks over as a block entry (nothing freed,
        nothing copied), and the tokens it holds."""
        entry, tokens = self.snapshot(uid)
        self.remove(uid)
        return entry, tokens

    def pending(self, uid: int) -> tuple[mx.array, mx.array] | None:
        """The token sampled for decoding row ``uid`` and not yet fed (as a device
        array of shape (1,)) with its log-probs; None when its next input is a prompt
        token."""
        if uid not in self.decoding or self.next_tokens is None:
            return None
        i = self.decoding.index(uid)
        lp = self.next_logprobs[i]
        return (self.next_tokens[i:i + 1], lp) if lp is not None else None

    def refeeding(self, uid: int) -> list[int]:
        """Row ``uid``'s tokens to feed again before its next input (see ``add``)."""
        return list(self.rows[uid].refeed)

    def close(self) -> None:
        for uid in list(self.rows):
            self.remove(uid)

    @property
    def prefilling(self) -> list[int]:
        """Rows still reading their prompt, oldest first."""
        return [u for u, r in self.rows.items() if len(r.todo) > 1]

    # -- passes ----------------------------------------------------------------------
    def prefill(self, chunks: dict[int, int]) -> list[int]:
        """Read the next ``chunks[uid]`` prompt tokens of each row, in one pass; the rows
        that have now read all but their prompt's last token (they decode from the next
        step)."""
        rows = [self.rows[u] for u in chunks]
        sizes = [r.chunk(chunks[r.uid]) for r in rows]
        width = max(sizes)
        feed = [r.todo[:n] for r, n in zip(rows, sizes)]
        inputs = mx.array([f + [0] * (width - len(f)) for f in feed], dtype=mx.uint32)
        self.reserve(rows, sizes)
        merged = (recurrent.merged(self.layout.state_ops, [r.states for r in rows], sizes)
                  if self.layout.recurrent else [])
        _, hidden = self.run_pass(inputs, rows, sizes, merged, direct=False)
        if merged:
            for r, s in zip(rows, recurrent.split(self.layout.state_ops, merged, len(rows))):
                r.states = s
        if hidden is not None:
            self._tap_prompt(rows, sizes, hidden)
        mx.eval(self._arrays(merged))
        done = []
        for r, f in zip(rows, feed):
            r.tokens += f
            r.table.length += len(f)
            r.todo = r.todo[len(f):]
            if r.processors:
                r.context = extended(r.context, mx.array(f))
            if len(r.todo) == 1:
                self._start_decoding(r)
                done.append(r.uid)
        return done

    def decode(self, drafts: Drafts | None = None,
               forcing: Forcing | None = None) -> list[Emit]:
        """One step for every decoding row: feed each its next input, queue the pass
        and the sampling after it, then hand out the fed tokens that were sampled.
        Rows may feed a window instead (``windows.py``): ``drafts[uid]``, guesses of
        the tokens after the row's next one, forced runs from ``forcing``, and the
        tokens a rollback left to feed again."""
        if not self.decoding:
            return []
        rows = [self.rows[u] for u in self.decoding]
        if drafts or forcing is not None or any(r.refeed for r in rows):
            return window_step(self, drafts or {}, forcing)
        assert self.next_tokens is not None
        inputs, fed_logprobs = self.next_tokens, self.next_logprobs
        zero = [r.uid for r, lp in zip(rows, fed_logprobs) if lp is None] if self.timed else []
        laps = Laps() if zero else None
        self.reserve(rows, [1] * len(rows))
        logits, hidden = self.run_pass(inputs[:, None], rows, [1] * len(rows), self.states.caches)
        if laps is not None:
            laps.lap(logits)
        logits = processed(rows, inputs, logits[:, -1, :])
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if laps is not None:
            laps.lap(logprobs)
        sampled = sample(logprobs, [r.sampler for r in rows])
        if laps is not None:
            laps.lap(sampled)
        self.zero = (zero, laps) if laps is not None else None
        mx.async_eval(sampled, logprobs, *self._arrays(self.states.caches))
        fed = cast("list[int]", inputs.tolist())
        # only now: a step that fails before here leaves every row's next input as it was
        self.next_tokens = sampled
        self.next_logprobs = list(logprobs)  # (one C++ loop: 32 indexings took 130 us)
        out = []
        for i, (r, token, lp) in enumerate(zip(rows, fed, fed_logprobs)):
            if r.tapped and hidden is not None and self.tap is not None:
                self.tap.kept(r.uid, hidden[i:i + 1], [token])
            r.tokens.append(token)
            r.table.length += 1
            if lp is None:  # the prompt's last token: nothing to hand out
                continue
            r.budget -= 1
            out.append(Emit(r.uid, token, lp, "length" if r.budget <= 0 else None))
        return out

    # -- pieces ----------------------------------------------------------------------
    def window(self, tables: list[BlockTable], valid: list[int], width: int) -> Window:
        """The tables of a pass (direct attention when the batch runs it)."""
        view = Window.over(tables, valid, width)
        view.direct = self.direct
        return view

    def _model_forward(self, inputs: mx.array, caches: list[Any]) -> mx.array:
        return cast(mx.array, self.model(inputs, cache=caches))

    def run_pass(self, inputs: mx.array, rows: list[Row], valid: list[int], states: list[Any],
                 direct: bool = True) -> tuple[mx.array, mx.array | None]:
        """One forward over ``rows`` fed ``inputs`` (``(rows, width)``, row ``r``'s first
        ``valid[r]`` positions real; ``states`` their merged recurrent caches): logits,
        and hidden states when a row is tapped (the tap then runs every row).
        ``direct``: attention may read the blocks directly (when the batch runs it).

        Under a KV scheme, rows holding no KV yet run apart from rows holding some (two
        passes): mlx-lm attends over a fresh cache's first keys in full precision and
        over quantized ones after that, and all rows of a pass attend one way."""
        tapped = self.tap is not None and any(r.tapped for r in rows)
        groups = self._fresh_apart(rows)
        if groups is None:
            out = self._forward(inputs, rows, valid, states, direct, tapped)
        else:
            ops = self.layout.state_ops
            parts = [recurrent.pick(ops, states, g) for g in groups]
            outs = [self._forward(inputs[mx.array(g)], [rows[i] for i in g],
                                  [valid[i] for i in g], part, direct, tapped)
                    for g, part in zip(groups, parts)]
            recurrent.put(ops, states, groups, parts)
            order = mx.array(recurrent.inverse(groups))
            hidden = [o[1] for o in outs if o[1] is not None]
            out = (mx.concatenate([o[0] for o in outs])[order],
                   mx.concatenate(hidden)[order] if hidden else None)
        if self.fault is not None:  # once a step, whether it ran as one pass or two
            self.fault()
        return out

    def _forward(self, inputs: mx.array, rows: list[Row], valid: list[int],
                 states: list[Any], direct: bool, tapped: bool
                 ) -> tuple[mx.array, mx.array | None]:
        """The model (or the tap, ``tapped``) over ``rows`` in one pass."""
        tables, width = [r.table for r in rows], int(inputs.shape[1])
        view = self.window(tables, valid, width) if direct else Window.over(tables, valid, width)
        caches = self._caches(view, states, [r.uid for r in rows])
        if tapped:
            assert self.tap is not None
            return self.tap.forward(inputs, caches)
        if width == 1 and self.lean is not None:
            return self.lean(inputs, caches), None
        return self.forward(inputs, caches), None

    def _fresh_apart(self, rows: list[Row]) -> list[list[int]] | None:
        """``[fresh, holding]`` row indices when a pass must split (see ``run_pass``); a
        row's first pass ended where its second begins (``Row.first_kept``)."""
        if not self.layout.quantized:
            return None
        for r in rows:
            if r.first is None and r.table.length:
                r.first = r.table.length
        fresh = [i for i, r in enumerate(rows) if not r.table.length]
        if not fresh or len(fresh) == len(rows):
            return None
        return [fresh, [i for i, r in enumerate(rows) if r.table.length]]

    def _tap_prompt(self, rows: list[Row], sizes: list[int], hidden: mx.array) -> None:
        """Hand the tapped rows of a prefill pass their chunk's states, each with the
        prompt token after it (the chunk never holds the prompt's last token)."""
        assert self.tap is not None
        at = [i for i, r in enumerate(rows) if r.tapped]
        picked = hidden if len(at) == len(rows) else hidden[mx.array(at)]
        self.tap.prompt([rows[i].uid for i in at], picked,
                        [rows[i].todo[1:sizes[i] + 1] for i in at])

    def _start_decoding(self, row: Row) -> None:
        """Row ``row`` has only its prompt's last token left: it joins the decode batch
        with that token as its next input."""
        token = mx.array(row.todo, dtype=mx.uint32)
        row.todo = []
        self.decoding.append(row.uid)
        self.states.add(row.uid, row.states)
        row.states = []
        self.next_tokens = token if self.next_tokens is None \
            else mx.concatenate([self.next_tokens, token])
        self.next_logprobs.append(None)

    def reserve(self, rows: list[Row], widths: list[int]) -> None:
        """Blocks for every row's next ``widths`` positions, growing the pool if it must."""
        need = sum(r.table.cost(r.table.length, r.table.length + w)
                   for r, w in zip(rows, widths))
        if need > self.pool.free:
            self._grow(need)
        for r, w in zip(rows, widths):
            r.table.reserve(r.table.length + w)
            self.layout.copy_blocks(r.table.writable(r.table.length, r.table.length + w))

    def _grow(self, need: int) -> None:
        """Make room for ``need`` more blocks: grow (doubling, up to the pool's limit),
        else take blocks back from the prefix cache (``reclaim``)."""
        pool = self.pool
        if pool.limit - pool.capacity < need - pool.free:
            if self.reclaim is not None:
                self.reclaim(need)
            if pool.free >= need:
                return
            raise OutOfBlocks(need, pool.room)
        want = pool.capacity + max(need - pool.free, pool.capacity)
        self.layout.grow(min(pool.limit, want))

    def _caches(self, view: Window, states: list[Any], uids: list[int]) -> list[Any]:
        """The per-layer cache objects of one pass (and the rows' adapter routing)."""
        if self.before is not None:
            self.before(uids)
        return self.layout.caches(view, states)

    def _arrays(self, states: list[Any]) -> list[Any]:
        """What a pass leaves to evaluate: the pool's arrays, the recurrent states and
        the tap's."""
        out = self.layout.arrays(states)
        if self.tap is not None:
            out += self.tap.arrays()
        return out
