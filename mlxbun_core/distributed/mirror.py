"""The serial lane's KV caches (mlx-lm's own cache objects), mirrored on every other rank.

Under tensor parallelism each rank's cache holds only its own attention heads (under
pipeline parallelism, only its own layers), so no rank can hand another its KV: each
keeps its own, and the followers' cache objects must go through exactly what rank 0's
go through. The batch lane's KV lives in the engine's block pool and is replayed from
its journal (``engine/batch/journal.py``); what is left here is the serial lane (a
seeded request, ``--batch 1``), which runs mlx-lm's single-sequence caches. Between
forward passes the engine changes them only through ``cache_ops.py``: made,
copied (the prefix cache's private copies), trimmed (a prefix hit cut back, a rejected
draft) and compacted (a trimmed copy giving back its buffer's tail). :func:`install`
has that module report each call to :data:`RECORDER`; on rank 0 each outermost call
(not one made inside a forward pass or a replay) is recorded with the cache objects
named by a serial number, and the followers replay the record (:class:`Replayer`)
before the next forward pass. An object rank 0 drops is
dropped on the followers too. No mlx-lm class or object is patched or marked: the serial
numbers live in a table of ours (:class:`~mlxbun_core.sidetable.SideTable`).

A cache rebuilt from saved arrays (a restore from disk, blocks exported into mlx-lm's
layout) cannot be replayed, since rank 0 holds only its own shard of the data: it is
recorded as such and the followers fail loudly, which the watchdog turns into a 503 and
an exit. The serve refuses the options that do this (``--ssd-cache``, ``--kv-quant``).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .. import cache_ops
from ..sidetable import SideTable

PLAIN = (bool, int, float, str, type(None))


class Recorder:
    """Rank 0's record of structural cache operations since the last descriptor."""

    def __init__(self) -> None:
        self.on = False  # recording (rank 0)
        self._ops: list[tuple] = []
        self._lock = threading.Lock()
        self._next = 0
        self._local = threading.local()
        self._uids: SideTable[int] = SideTable()  # cache object -> its serial number

    # -- depth: only the outermost cache call is recorded ----------------------------
    def depth(self) -> int:
        return int(getattr(self._local, "depth", 0))

    def enter(self) -> None:
        self._local.depth = self.depth() + 1

    def leave(self) -> None:
        self._local.depth = self.depth() - 1

    def quiet(self) -> _Quiet:
        """A block whose cache calls are not recorded (a forward pass: the followers run
        their own)."""
        return _Quiet(self)

    def outermost(self) -> bool:
        """Whether a cache call made now is to be recorded."""
        return self.on and self.depth() == 0

    # -- serial numbers ----------------------------------------------------------------
    def uid(self, obj: Any) -> int:
        uid = self._uids.get(obj)
        if uid is None:
            with self._lock:
                self._next += 1
                uid = self._next
            self._uids.set(obj, uid)
            if self.on:
                weakref.finalize(obj, self.add, ("drop", uid))
        return uid

    # -- what cache_ops.py reports ----------------------------------------------
    def made(self, caches: list[Any]) -> None:
        if self.outermost():
            self.add(("make", self.encode(caches)))

    def copied(self, source: Any, new: Any) -> None:
        if self.outermost():
            self.add(("copy", self.encode(source), self.encode(new)))

    def trimmed(self, caches: list[Any], n: int) -> None:
        if self.outermost():
            self.add(("trim", self.encode(caches), n))

    def compacted(self, caches: list[Any]) -> None:
        if self.outermost():
            self.add(("compact", self.encode(caches)))

    def unreplayable(self, what: str) -> None:
        if self.outermost():
            self.add(("unreplayable", what))

    def add(self, op: tuple) -> None:
        with self._lock:
            self._ops.append(op)

    def take(self) -> list[tuple]:
        """The operations recorded since the last call, in order."""
        with self._lock:
            ops, self._ops = self._ops, []
        return ops

    # -- values in a record --------------------------------------------------------------
    def encode(self, value: Any) -> Any:
        """``value`` as plain data: cache objects by serial number, arrays as numbers;
        anything else that is not plain cannot reach the other ranks (``TypeError``)."""
        if _is_cache(value):
            children = getattr(value, "caches", None)  # a CacheList's own caches
            if isinstance(children, (list, tuple)) and all(map(_is_cache, children)):
                return ("c", self.uid(value), [self.encode(c) for c in children])
            return ("c", self.uid(value))
        if isinstance(value, list):
            return ("l", [self.encode(v) for v in value])
        if isinstance(value, tuple):
            return ("t", [self.encode(v) for v in value])
        if isinstance(value, dict):
            return ("d", {k: self.encode(v) for k, v in value.items()})
        if _is_array(value):
            import numpy as np

            return ("a", np.array(value), str(value.dtype).rpartition(".")[2])
        if isinstance(value, PLAIN):
            return ("v", value)
        raise TypeError(f"a {type(value).__name__} cannot be mirrored on the other ranks")


class _Quiet:
    def __init__(self, rec: Recorder):
        self.rec = rec

    def __enter__(self) -> None:
        self.rec.enter()

    def __exit__(self, *exc: object) -> None:
        self.rec.leave()


RECORDER = Recorder()
_model: Any = None  # a follower's own model, for a replayed make
_base: tuple[type, ...] | None = None  # mlx-lm's cache classes, once installed


def _is_cache(value: Any) -> bool:
    return _base is not None and isinstance(value, _base)


def _is_array(value: Any) -> bool:
    import mlx.core as mx

    return isinstance(value, mx.array)


def install(recording: bool, model: Any = None) -> None:
    """Have ``cache_ops.py`` report to :data:`RECORDER` (load the model first:
    architectures may define cache classes of their own); ``recording`` on rank 0, and
    ``model`` is this rank's own, which a replayed ``make`` makes caches for."""
    global _base, _model
    from ..models.classes import cache_classes

    _base = cache_classes()
    _model = model
    cache_ops.record_with(RECORDER)
    RECORDER.on = recording


class Replayer:
    """A follower's cache objects, by rank 0's serial numbers, and the replay of its record."""

    def __init__(self) -> None:
        self.objects: dict[int, Any] = {}

    def decode(self, value: Any) -> Any:
        tag = value[0]
        if tag == "c":
            return self.objects[value[1]]
        if tag == "l":
            return [self.decode(v) for v in value[1]]
        if tag == "t":
            return tuple(self.decode(v) for v in value[1])
        if tag == "d":
            return {k: self.decode(v) for k, v in value[1].items()}
        if tag == "a":
            import mlx.core as mx

            return mx.array(value[1], dtype=getattr(mx, value[2]))
        return value[1]

    def bind(self, enc: Any, obj: Any) -> None:
        """Name the objects a replayed call returned as rank 0 named its own."""
        tag = enc[0]
        if tag == "c":
            self.objects[enc[1]] = obj
            if len(enc) > 2:
                for sub_enc, sub in zip(enc[2], getattr(obj, "caches", ()), strict=False):
                    self.bind(sub_enc, sub)
        elif tag in ("l", "t") and isinstance(obj, (list, tuple)):
            for e, o in zip(enc[1], obj, strict=False):
                self.bind(e, o)

    def replay(self, ops: list[tuple]) -> None:
        with RECORDER.quiet():
            for op in ops:
                self._one(op)

    def _one(self, op: tuple) -> None:
        kind = op[0]
        if kind == "drop":
            self.objects.pop(op[1], None)
        elif kind == "make":
            self.bind(op[1], cache_ops.make(_model))
        elif kind == "copy":
            self.bind(op[2], cache_ops.copy(self.decode(op[1])))
        elif kind == "trim":
            cache_ops.trim(self.decode(op[1]), op[2])
        elif kind == "compact":
            cache_ops.compact(self.decode(op[1]))
        elif kind == "unreplayable":
            raise RuntimeError(f"rank 0 did what a follower cannot mirror: {op[1]}")
        else:
            raise RuntimeError(f"unknown cache operation {kind!r}")

    def caches(self, enc: Any) -> Any:
        return None if enc is None else self.decode(enc)
