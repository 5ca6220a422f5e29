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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx

from ...kvquant import OFF, KVScheme
from . import states as recurrent
from .layout import Layout, Slot
from .pool import BlockPool, BlockTable, OutOfBlocks
from .quantized import layer_for
from .storage import LayerStore
from .view import PagedLayer, Window

Forward = Callable[[mx.array, list[Any]], mx.array]
"""A forward pass: ``(inputs (rows, width), caches) -> logits (rows, width, vocab)``."""


@dataclass
class Emit:
    """A token handed out: row ``uid``'s ``token`` with its ``logprobs`` and the
    grammar-forced run fed after it (``forced``); ``finish`` is ``"length"`` when it
    used up the row's budget. The first token a row hands out in a step that carried
    its drafts says how many it fed (``drafted``) and kept (``accepted``)."""

    uid: int
    token: int
    logprobs: mx.array
    finish: str | None = None
    forced: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


Forcing = Callable[[list[int], list[int]], dict[int, list[int]]]
"""``forcing(uids, tokens)``: the grammar-forced run each row feeds after its next
input ``tokens[i]`` (sampled, about to be handed out, now read on the host)."""


@dataclass
class Row:
    uid: int
    table: BlockTable
    tokens: list[int]  # tokens whose KV is written, in order
    todo: list[int]  # prompt tokens not yet fed (the last one is the first decode input)
    sampler: Any
    processors: Sequence[Any]
    budget: int  # tokens it may still generate
    states: list[Any] = field(default_factory=list)  # recurrent state while not decoding
    context: mx.array | None = None  # what its logits processors see: every fed token


class Batch:
    """Rows of one model over ``pool``. ``before(uids)`` runs ahead of every forward
    pass with the rows it carries, in order (per-row adapter routing); ``kv``: the KV
    scheme the blocks keep (``--kv-quant``)."""

    def __init__(self, model: Any, slots: list[Slot], pool: BlockPool,
                 before: Callable[[list[int]], None] | None = None, kv: KVScheme = OFF):
        self.model = model
        self.layout = Layout(slots, pool, kv)
        self.pool = pool
        self.before = before
        self.rows: dict[int, Row] = {}
        self.decoding: list[int] = []  # uids, in the decode batch's order
        self.states = recurrent.StateBatch(len(self.layout.recurrent))
        # the next decode input per decoding row: device tokens, and which were sampled
        self._next: mx.array | None = None
        self._next_logprobs: list[mx.array | None] = []
        self.forward: Forward = self._model_forward

    # -- rows in and out -------------------------------------------------------------
    def add(self, uid: int, todo: list[int], *, cache: list[Any] | None = None,
            held: Sequence[int] = (), sampler: Any = None, processors: Sequence[Any] = (),
            budget: int = 1 << 30) -> None:
        """Start row ``uid``: ``cache`` (a single-sequence mlx-lm cache, or None) holds
        ``held``; ``todo`` (at least one token) is fed next."""
        if not todo:
            raise ValueError("a row needs at least one token to feed")
        table = BlockTable(self.pool)
        states = (self._load(table, cache, len(held)) if cache is not None and held
                  else self.layout.fresh_states())
        self.rows[uid] = Row(uid, table, list(held), list(todo), sampler, processors, budget,
                             states)
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
            if self._next is not None:
                self._next = self._next[mx.array(keep)] if keep else None
            self._next_logprobs = [self._next_logprobs[i] for i in keep]

    def export(self, uid: int) -> tuple[list[Any], list[int]]:
        """Row ``uid``'s KV as a fresh single-sequence mlx-lm cache, and the tokens it
        holds (the row goes on)."""
        row = self.rows[uid]
        states = self.states.take(uid) if uid in self.decoding else row.states
        return self.layout.export(row.table, states), list(row.tokens)

    def pending(self, uid: int) -> tuple[mx.array, mx.array] | None:
        """The token sampled for decoding row ``uid`` and not yet fed (as a device
        array of shape (1,)) with its log-probs; None when its next input is a prompt
        token."""
        if uid not in self.decoding or self._next is None:
            return None
        i = self.decoding.index(uid)
        lp = self._next_logprobs[i]
        return (self._next[i:i + 1], lp) if lp is not None else None

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
        sizes = [max(1, min(chunks[r.uid], len(r.todo) - 1)) for r in rows]
        width = max(sizes)
        feed = [r.todo[:n] for r, n in zip(rows, sizes)]
        inputs = mx.array([f + [0] * (width - len(f)) for f in feed], dtype=mx.uint32)
        self._reserve(rows, sizes)
        merged = (recurrent.merged([r.states for r in rows], sizes)
                  if self.layout.recurrent else [])
        self._pass(rows, inputs, sizes, width, merged)
        if merged:
            for r, s in zip(rows, recurrent.split(merged, len(rows))):
                r.states = s
        mx.eval(self._arrays(merged))
        done = []
        for r, f in zip(rows, feed):
            r.tokens += f
            r.table.length += len(f)
            r.todo = r.todo[len(f):]
            if r.processors:
                r.context = _extended(r.context, mx.array(f))
            if len(r.todo) == 1:
                self._start_decoding(r)
                done.append(r.uid)
        return done

    def decode(self, drafts: dict[int, list[int]] | None = None,
               forcing: Forcing | None = None) -> list[Emit]:
        """One step for every decoding row: feed each its next input, queue the pass
        and the sampling after it, then hand out the fed tokens that were sampled.
        Rows may feed a window instead (``windows.py``): ``drafts[uid]``, guesses of
        the tokens after the row's next one, and forced runs from ``forcing``."""
        if not self.decoding:
            return []
        if drafts or forcing is not None:
            from .windows import window_step

            return window_step(self, drafts or {}, forcing)
        rows = [self.rows[u] for u in self.decoding]
        assert self._next is not None
        inputs, fed_logprobs = self._next, self._next_logprobs
        self._reserve(rows, [1] * len(rows))
        logits = self._pass(rows, inputs[:, None], [1] * len(rows), 1,
                            self.states.caches)[:, -1, :]
        logits = self._processed(rows, inputs, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled = _sample(logprobs, [r.sampler for r in rows])
        self._next = sampled
        self._next_logprobs = [logprobs[i] for i in range(len(rows))]
        mx.async_eval(sampled, logprobs, *self._arrays(self.states.caches))
        fed = cast("list[int]", inputs.tolist())
        out = []
        for r, token, lp in zip(rows, fed, fed_logprobs):
            r.tokens.append(token)
            r.table.length += 1
            if lp is None:  # the prompt's last token: nothing to hand out
                continue
            r.budget -= 1
            out.append(Emit(r.uid, token, lp, "length" if r.budget <= 0 else None))
        return out

    # -- pieces ----------------------------------------------------------------------
    def _model_forward(self, inputs: mx.array, caches: list[Any]) -> mx.array:
        return cast(mx.array, self.model(inputs, cache=caches))

    def _start_decoding(self, row: Row) -> None:
        """Row ``row`` has only its prompt's last token left: it joins the decode batch
        with that token as its next input."""
        token = mx.array(row.todo, dtype=mx.uint32)
        row.todo = []
        self.decoding.append(row.uid)
        self.states.add(row.uid, row.states)
        row.states = []
        self._next = token if self._next is None else mx.concatenate([self._next, token])
        self._next_logprobs.append(None)

    def _reserve(self, rows: list[Row], widths: list[int]) -> None:
        """Blocks for every row's next ``widths`` positions, growing the pool if it must."""
        need = sum(max(0, self.pool.blocks_for(r.table.length + w) - len(r.table.blocks))
                   for r, w in zip(rows, widths))
        if need > self.pool.free:
            self._grow(need)
        for r, w in zip(rows, widths):
            r.table.reserve(r.table.length + w)
            self.layout.copy_blocks(r.table.writable(r.table.length, r.table.length + w))

    def _grow(self, need: int) -> None:
        """Make room for ``need`` more blocks (doubling, up to the pool's limit)."""
        pool = self.pool
        want = pool.capacity + max(need - pool.free, pool.capacity)
        if pool.limit - pool.capacity < need - pool.free:
            raise OutOfBlocks(need, pool.room)
        self.layout.grow(min(pool.limit, want))

    def _pass(self, rows: list[Row], inputs: mx.array, valid: list[int], width: int,
              states: list[Any]) -> mx.array:
        """The model over ``rows`` fed ``inputs`` (``(rows, width)``; row ``r``'s first
        ``valid[r]`` real), ``states`` their merged recurrent caches; the logits.

        Under a KV scheme, rows holding no KV yet run apart from rows holding some (two
        passes): mlx-lm attends over a fresh cache's first keys in full precision and
        over quantized ones after that, and all rows of a pass attend one way."""
        groups = self._fresh_apart(rows)
        if groups is None:
            view = Window([r.table for r in rows], valid, width)
            return self.forward(inputs, self._caches(view, states, [r.uid for r in rows]))
        parts = [recurrent.pick(states, g) for g in groups]
        out = []
        for g, part in zip(groups, parts):
            view = Window([rows[i].table for i in g], [valid[i] for i in g], width)
            out.append(self.forward(inputs[mx.array(g)],
                                    self._caches(view, part, [rows[i].uid for i in g])))
        recurrent.put(states, groups, parts)
        return mx.concatenate(out)[mx.array(recurrent.inverse(groups))]

    def _fresh_apart(self, rows: list[Row]) -> list[list[int]] | None:
        """``[fresh, holding]`` row indices when a pass must split (see ``_pass``)."""
        if not self.layout.quantized:
            return None
        fresh = [i for i, r in enumerate(rows) if not r.table.length]
        if not fresh or len(fresh) == len(rows):
            return None
        return [fresh, [i for i, r in enumerate(rows) if r.table.length]]

    def _caches(self, view: Window, states: list[Any], uids: list[int]) -> list[Any]:
        """The per-layer cache objects of one pass (and the rows' adapter routing)."""
        if self.before is not None:
            self.before(uids)
        from mlx_lm.models.cache import CacheList

        rec = iter(states)
        if self.layout.schemed:  # (see quantized.py)
            first = self.layout.quantized and not view.starts.any()
            return [next(rec) if store is None else
                    CacheList(*(layer_for(s, view, None, first) for s in store))
                    if isinstance(store, list) else layer_for(store, view, slot.window, first)
                    for slot, store in zip(self.layout.slots, self.layout.stores)]
        return [next(rec) if store is None else
                CacheList(*(PagedLayer(s, view) for s in store)) if isinstance(store, list)
                else PagedLayer(cast(LayerStore, store), view, slot.window)
                for slot, store in zip(self.layout.slots, self.layout.stores)]

    def _arrays(self, states: list[Any]) -> list[Any]:
        """What a pass leaves to evaluate: the pool's arrays and the recurrent states."""
        out: list[Any] = [a for s in self.layout.all_stores() for a in s.arrays()]
        for c in states:
            out += [a for a in c.cache if a is not None]
        return out

    def _processed(self, rows: list[Row], inputs: mx.array, logits: mx.array) -> mx.array:
        """Each row's logits processors over every token it was fed (its context)."""
        if not any(r.processors for r in rows):
            return logits
        out = []
        for i, r in enumerate(rows):
            x = logits[i:i + 1]
            if r.processors:
                r.context = _extended(r.context, inputs[i:i + 1])
                for p in r.processors:
                    x = p(r.context, x)
            out.append(x)
        return mx.concatenate(out, axis=0)


def _extended(context: mx.array | None, tokens: mx.array) -> mx.array:
    return tokens if context is None else mx.concatenate([context, tokens])


def _sample(logprobs: mx.array, samplers: list[Any]) -> mx.array:
    """Each row's token from its sampler (None: greedy); one call when rows share one."""
    first = samplers[0]
    if all(s is first for s in samplers):
        return mx.argmax(logprobs, axis=-1) if first is None else first(logprobs)
    return mx.concatenate([
        mx.argmax(logprobs[i:i + 1], axis=-1) if s is None else s(logprobs[i:i + 1])
        for i, s in enumerate(samplers)])
