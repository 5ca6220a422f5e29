"""A follower's side of the batch's journal (``journal.py``): block pools and recurrent
states of its own, put through what rank 0's went through.

Under tensor parallelism each rank keeps only its own KV heads (under pipeline
parallelism, only its own layers), so no rank can hand another its KV: each must put
its own pool through the same changes. A :class:`Replica` applies rank 0's journal to
layouts and states of its own (its own layers' kinds and sizes, rank 0's block ids and
slots, rank 0's names for them) and builds each pass's cache objects from the pass's
plan (``Window.replay``).
"""

from __future__ import annotations

from typing import Any

from .journal import Ref
from .layout import RECURRENT, Layout, layout
from .pool import BlockPool
from .states import StateOps
from .view import Window


class Replica:
    """A follower's layouts and recurrent states, under rank 0's names, over its own
    ``model``'s layers."""

    def __init__(self, model: Any):
        self.slots = layout(model)  # None: some layer's cache cannot be paged
        self.layouts: dict[int, Layout] = {}
        self.states: dict[int, Any] = {}
        self.ops = StateOps([s.size for s in self.slots or () if s.kind == RECURRENT])

    def apply(self, ops: list[tuple[Any, ...]]) -> None:
        """Rank 0's record since the last pass, in order."""
        for op in ops:
            kind = op[0]
            if kind == "state":
                _, name, args, out = op
                made = self.ops.apply(name, self._resolve(args))
                if out is not None:
                    self.states[out] = made
            elif kind in ("grow", "copy_blocks"):
                getattr(self.layouts[op[1]], kind)(op[2])
            elif kind == "layout":
                _, uid, block_size, capacity, limit = op
                if self.slots is None:
                    raise RuntimeError("this rank's layers keep caches the batch cannot page")
                self.layouts[uid] = Layout(self.slots, BlockPool(block_size, capacity, limit))
            elif kind == "drop":
                self.layouts.pop(op[1], None)
                self.states.pop(op[1], None)
            else:
                raise RuntimeError(f"unknown batch operation {kind!r}")

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, Ref):
            return self.states[value.uid]
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        return value

    def caches(self, plan: tuple[Any, ...]) -> list[Any]:
        """The cache objects of the pass ``plan`` describes, over this rank's stores."""
        uid, window, refs = plan
        made = self.layouts[uid]
        top = max((max(ids) for ids in window[3] if ids), default=0)
        if top >= made.pool.capacity:  # a scatter past the stores would crash the process
            raise RuntimeError(f"rank 0's pass reaches block {top}, past this rank's "
                               f"{made.pool.capacity}: the ranks' pools went apart")
        view = Window.replay(window, made.pool.block_size)
        if view.direct:
            from . import attention

            attention.install()
        return made.caches(view, self._resolve(refs))

    def arrays(self, plan: tuple[Any, ...]) -> list[Any]:
        """What the pass ``plan`` described leaves to evaluate (after it ran)."""
        uid, _, refs = plan
        return self.layouts[uid].arrays(self._resolve(refs))
