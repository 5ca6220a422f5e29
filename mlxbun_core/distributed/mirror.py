"""The serial lane's KV caches (mlx-lm's own cache objects), mirrored on every other rank.

Under tensor parallelism each rank's cache holds only its own attention heads (under
pipeline parallelism, only its own layers), so no rank can hand another its KV: each
keeps its own, and the followers' cache objects must go through exactly what rank 0's
go through. The batch lane's KV lives in the engine's block pool and is replayed from
its journal (``engine/batch/journal.py``); what is left here is the serial lane (a
seeded request, ``--batch 1``), which runs mlx-lm's single-sequence caches. Between
forward passes it changes them in three ways only: ``make_prompt_cache``,
``copy.deepcopy`` (the prefix cache's private copies) and ``trim`` (a prefix hit cut
back, a rejected draft). :func:`install` wraps those; on rank 0 each outermost call
(one made by the engine, not one inside another cache call or inside a forward pass)
is recorded with the cache objects named by a serial number, and the followers replay
the record (:class:`Replayer`) before the next forward pass. An object rank 0 drops is
dropped on the followers too.

A cache whose arrays are set from outside (``state = ...``: a restore from disk, a
KV-quantization swap) cannot be replayed, since rank 0 holds only its own shard of the
data: it is recorded as such and the followers fail loudly, which the watchdog turns
into a 503 and an exit. The serve refuses the options that do this (``--ssd-cache``,
``--kv-quant``).
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

UID = "_mlxbun_uid"
# the wrappers made here: install() never wraps a wrapper again
WRAPPERS: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
PLAIN = (bool, int, float, str, type(None))


class Recorder:
    """Rank 0's record of structural cache operations since the last descriptor."""

    def __init__(self) -> None:
        self.on = False  # recording (rank 0); followers only keep the wrappers quiet
        self._ops: list[tuple] = []
        self._lock = threading.Lock()
        self._next = 0
        self._local = threading.local()

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
        uid = obj.__dict__.get(UID)
        if uid is None:
            with self._lock:
                self._next += 1
                uid = self._next
            obj.__dict__[UID] = uid
            if self.on:
                weakref.finalize(obj, self.add, ("drop", uid))
        return int(uid)

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
_model: Any = None  # a follower's own model, for replaying make_prompt_cache
_base: tuple[type, ...] | None = None  # mlx-lm's cache classes, once installed


def _is_cache(value: Any) -> bool:
    return _base is not None and isinstance(value, _base)


def _is_array(value: Any) -> bool:
    import mlx.core as mx

    return isinstance(value, mx.array)


def _recorded(fn: Callable[..., Any], kind: str, name: str = "") -> Any:
    """``fn(first, *args, **kwargs)`` recorded when rank 0 calls it outermost, as
    ``(kind, first's serial number (a cache's method) or None, name, args, kwargs,
    result)``."""
    @functools.wraps(fn)
    def call(first: Any, *args: Any, **kwargs: Any) -> Any:
        rec = RECORDER
        outer = rec.outermost()
        if outer:
            target = rec.uid(first) if kind == "call" else None
            enc = (rec.encode(list(args)), rec.encode(kwargs))
        with rec.quiet():
            out = fn(first, *args, **kwargs)
        if outer:
            rec.add((kind, target, name, *enc, rec.encode(out)))
        return out
    WRAPPERS.add(call)
    return call


def _deepcopy(self: Any, memo: dict) -> Any:
    """``copy.deepcopy`` of a cache: the usual copy, recorded (the copy gets its own uid)."""
    rec = RECORDER
    outer = rec.outermost()
    cls: Any = type(self)
    new = cls.__new__(cls)
    memo[id(self)] = new
    with rec.quiet():
        for key, value in self.__dict__.items():
            if key != UID:
                new.__dict__[key] = copy.deepcopy(value, memo)
    if outer:
        rec.add(("copy", rec.uid(self), rec.uid(new)))
    return new


def _wrap_setter(prop: property, name: str) -> property:
    fset = prop.fset
    assert fset is not None

    def setter(self: Any, value: Any) -> None:
        if RECORDER.outermost():
            RECORDER.add(("unreplayable", f"{type(self).__name__}.{name} set from outside"))
        fset(self, value)
    WRAPPERS.add(setter)
    return property(prop.fget, setter, prop.fdel, prop.__doc__)


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    sub: type
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def install(recording: bool, model: Any = None) -> None:
    """Wrap every mlx-lm cache class known now (load the model first: architectures may
    define their own); ``recording`` on rank 0."""
    global _base, _model
    from mlx_lm.models import cache as mc

    from ..models.classes import cache_classes

    roots = cache_classes()
    _base = roots
    _model = model
    if mc.make_prompt_cache not in WRAPPERS:
        from mlx_lm import generate

        wrapped = _recorded(mc.make_prompt_cache, "make")
        mc.make_prompt_cache = wrapped
        generate.make_prompt_cache = wrapped  # type: ignore[attr-defined]  # imported by name
    for root in roots:
        if "__deepcopy__" not in root.__dict__:
            type.__setattr__(root, "__deepcopy__", _deepcopy)  # added on purpose
    for cls in dict.fromkeys(c for root in roots for c in _subclasses(root)):
        own = cls.__dict__
        trim = own.get("trim")
        if callable(trim) and trim not in WRAPPERS:
            type.__setattr__(cls, "trim", _recorded(trim, "call", "trim"))
        for name in ("state", "meta_state"):
            member = own.get(name)
            if isinstance(member, property) and member.fset is not None \
                    and member.fset not in WRAPPERS:
                type.__setattr__(cls, name, _wrap_setter(member, name))
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
        elif kind == "copy":
            self.objects[op[2]] = copy.deepcopy(self.objects[op[1]])
        elif kind in ("call", "make"):
            _, uid, name, args, kwargs, out = op
            if kind == "call":
                fn = getattr(self.objects[uid], name)
            else:
                from mlx_lm.models import cache as mc

                fn = functools.partial(mc.make_prompt_cache, _model)
            self.bind(out, fn(*self.decode(args), **self.decode(kwargs)))
        elif kind == "unreplayable":
            raise RuntimeError(f"rank 0 did what a follower cannot mirror: {op[1]}")
        else:
            raise RuntimeError(f"unknown cache operation {kind!r}")

    def caches(self, enc: Any) -> Any:
        return None if enc is None else self.decode(enc)
