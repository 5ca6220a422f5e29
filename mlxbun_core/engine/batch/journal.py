"""The batch as plain data: rank 0 writes down what its passes change, and every other
rank of a distributed serve applies the same to block pools of its own.

Under tensor parallelism each rank keeps only its own KV heads (under pipeline
parallelism, only its own layers), so no rank can hand another its KV: each must put
its own pool through the same changes. Between forward passes a batch's pool changes
only by growth (``Layout.grow``) and copy-on-write block copies
(``Layout.copy_blocks``), its recurrent states only by ``states.StateOps``; a pass
itself is its ``Window`` (block tables, offsets, widths: plain numbers) and the
recurrent states it runs on. On rank 0 a :class:`Journal` given to the batch records
each of these, naming layouts and state objects by serial number (an object rank 0
drops is dropped everywhere), and every pass's cache list comes out as a :class:`Pass`
carrying its plan. A follower applies the record to layouts and states of its own
(``replay.py``).

Moving KV between the pool and mlx-lm's own caches (``Layout.load``, ``Layout.export``)
carries one process's data alone: a journaled layout refuses it.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, NamedTuple


class Ref(NamedTuple):
    """A recurrent state object, by its serial number in a journal."""

    uid: int


class Pass(list[Any]):
    """One pass's per-layer cache objects (what the model is called with) and ``plan``:
    ``(layout number, Window.plan(), [Ref of each recurrent layer's state])``."""

    plan: tuple[Any, ...] = ()


class Journal:
    """Rank 0's record of what its batch changes, taken with every forward pass."""

    def __init__(self) -> None:
        self._ops: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._serial = itertools.count(1)
        self._names: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def add(self, op: tuple[Any, ...]) -> None:
        with self._lock:
            self._ops.append(op)

    def take(self) -> list[tuple[Any, ...]]:
        """The operations recorded since the last call, in order."""
        with self._lock:
            ops, self._ops = self._ops, []
        return ops

    def _name(self, obj: Any) -> int:
        uid = next(self._serial)
        self._names[obj] = uid
        weakref.finalize(obj, self.add, ("drop", uid))
        return uid

    def layout(self, made: Any) -> int:
        """Name a new ``Layout`` (its pool's block size, capacity and limit go along)."""
        uid = self._name(made)
        pool = made.pool
        self.add(("layout", uid, pool.block_size, pool.capacity, pool.limit))
        return uid

    def state_op(self, name: str, args: tuple[Any, ...], out: Any) -> None:
        """A recurrent state operation that ran (``out``: the state it made, if any)."""
        refs = self.refs(list(args))
        self.add(("state", name, refs, None if out is None else self._name(out)))

    def refs(self, value: Any) -> Any:
        """``value`` with every state object as its :class:`Ref` (numbers as they are)."""
        if isinstance(value, list):
            return [self.refs(v) for v in value]
        if isinstance(value, int):
            return value
        uid = self._names.get(value)
        if uid is None:
            raise RuntimeError(f"a {type(value).__name__} the batch's journal never saw made "
                               "cannot be replayed by the other ranks")
        return Ref(uid)

    def pass_of(self, layout: int, caches: list[Any], window: tuple[Any, ...],
                states: list[Any]) -> Pass:
        """``caches`` of a pass over layout number ``layout``, carrying its plan."""
        out = Pass(caches)
        out.plan = (layout, window, self.refs(list(states)))
        return out
