"""Rank 0's KV cache objects, mirrored on every other rank.

Under tensor parallelism each rank's cache holds only its own attention heads (under
pipeline parallelism, only its own layers), so no rank can hand another its KV: each
keeps its own, and the followers' cache objects must go through exactly what rank 0's
go through. The engine changes them in two ways only: forward passes (which followers
run themselves, see :mod:`.lockstep`) and structural operations between them, all of
them methods of mlx-lm's cache classes: construction, ``copy.deepcopy``, ``trim``,
``merge``, ``filter``, ``extend``, ``extract``, ``prepare``, ``finalize``,
``to_quantized``, ``advance``, item assignment. :func:`install` wraps those methods on
every cache class; on rank 0 each outermost call (one made by the engine or by
mlx-lm's batch code, not one inside another cache method or inside a forward pass) is
recorded with the cache objects named by a serial number, and the followers replay the
record (:class:`Replayer`) before the next forward pass. An object rank 0 drops is
dropped on the followers too.

A cache whose arrays are set from outside (``state = ...``, ``from_state``: a restore
from disk, a KV-quantization swap) cannot be replayed, since rank 0 holds only its own
shard of the data: it is recorded as such and the followers fail loudly, which the
watchdog turns into a 503 and an exit. The serve refuses the options that do this
(``--ssd-cache``, ``--kv-quant``).
"""

from __future__ import annotations

import copy
import functools
import importlib
import threading
import weakref
from typing import Any

UID = "_mlxbun_uid"
METHODS = ("trim", "filter", "extend", "extract", "prepare", "finalize", "to_quantized",
           "advance", "__setitem__", "merge", "maybe_trim_front")


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

    # -- serial numbers ----------------------------------------------------------------
    def uid(self, obj: Any) -> int:
        uid = obj.__dict__.get(UID)
        if uid is None:
            with self._lock:
                self._next += 1
                uid = self._next
            obj.__dict__[UID] = uid
            if self.on:
                weakref.finalize(obj, self._dropped, uid)
        return int(uid)

    def _dropped(self, uid: int) -> None:
        with self._lock:
            self._ops.append(("drop", uid))

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
        return ("v", value)


class _Quiet:
    def __init__(self, rec: Recorder):
        self.rec = rec

    def __enter__(self) -> None:
        self.rec.enter()

    def __exit__(self, *exc: object) -> None:
        self.rec.leave()


RECORDER = Recorder()
_model: Any = None  # a follower's own model, for replaying make_prompt_cache
_installed: set[type] = set()
_base: type | None = None


def _is_cache(value: Any) -> bool:
    return _base is not None and isinstance(value, _base)


def _is_array(value: Any) -> bool:
    import mlx.core as mx

    return isinstance(value, mx.array)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _wrap_init(cls: type, init: Any) -> Any:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        rec = RECORDER
        outer = rec.on and rec.depth() == 0
        enc = (rec.encode(list(args)), rec.encode(kwargs)) if outer else None
        rec.enter()
        try:
            init(self, *args, **kwargs)
        finally:
            rec.leave()
        uid = rec.uid(self)
        if enc is not None:  # the outermost constructor: the object's own class
            rec.add(("new", uid, _class_path(type(self)), *enc))
    return __init__


def _wrap_method(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = RECORDER
        outer = rec.on and rec.depth() == 0
        if outer:
            target, enc = rec.uid(self), (rec.encode(list(args)), rec.encode(kwargs))
        rec.enter()
        try:
            out = fn(self, *args, **kwargs)
        finally:
            rec.leave()
        if outer:
            rec.add(("call", target, name, *enc, rec.encode(out)))
        return out
    return method


def _wrap_classmethod(cls: type, name: str, fn: Any) -> Any:
    def method(klass: type, *args: Any, **kwargs: Any) -> Any:
        rec = RECORDER
        outer = rec.on and rec.depth() == 0
        if outer:
            enc = (rec.encode(list(args)), rec.encode(kwargs))
        rec.enter()
        try:
            out = fn(klass, *args, **kwargs)
        finally:
            rec.leave()
        if outer:
            rec.add(("cls", _class_path(klass), name, *enc, rec.encode(out)))
        return out
    return classmethod(functools.wraps(fn)(method))


def _deepcopy(self: Any, memo: dict) -> Any:
    """``copy.deepcopy`` of a cache: the usual copy, recorded (the copy gets its own uid)."""
    rec = RECORDER
    outer = rec.on and rec.depth() == 0
    cls: Any = type(self)
    new = cls.__new__(cls)
    memo[id(self)] = new
    rec.enter()
    try:
        for key, value in self.__dict__.items():
            if key != UID:
                new.__dict__[key] = copy.deepcopy(value, memo)
    finally:
        rec.leave()
    if outer:
        rec.add(("copy", rec.uid(self), rec.uid(new)))
    return new


def _wrap_setter(prop: property, name: str) -> property:
    fset = prop.fset
    assert fset is not None

    def setter(self: Any, value: Any) -> None:
        if RECORDER.on and RECORDER.depth() == 0:
            RECORDER.add(("unreplayable", f"{type(self).__name__}.{name} set from outside"))
        fset(self, value)
    return property(prop.fget, setter, prop.fdel, prop.__doc__)


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    sub: type
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def _wrap_make_prompt_cache(fn: Any) -> Any:
    """``make_prompt_cache(model)`` recorded as one operation: each rank makes its own,
    since under pipeline parallelism each rank's layers (and so its cache kinds) differ."""
    @functools.wraps(fn)
    def make_prompt_cache(model: Any, *args: Any, **kwargs: Any) -> Any:
        rec = RECORDER
        outer = rec.on and rec.depth() == 0
        if outer:
            enc = (rec.encode(list(args)), rec.encode(kwargs))
        rec.enter()
        try:
            out = fn(model, *args, **kwargs)
        finally:
            rec.leave()
        if outer:
            rec.add(("make", *enc, rec.encode(out)))
        return out
    make_prompt_cache._mlxbun_wrapped = True  # type: ignore[attr-defined]  # marks our wrapper
    return make_prompt_cache


def install(recording: bool, model: Any = None) -> None:
    """Wrap every mlx-lm cache class known now (load the model first: architectures may
    define their own); ``recording`` on rank 0."""
    global _base
    from mlx_lm.models import cache as mc

    _base = mc._BaseCache
    global _model
    _model = model
    if not getattr(mc.make_prompt_cache, "_mlxbun_wrapped", False):
        from mlx_lm import generate

        wrapped = _wrap_make_prompt_cache(mc.make_prompt_cache)
        mc.make_prompt_cache = wrapped
        generate.make_prompt_cache = wrapped  # type: ignore[attr-defined]  # imported by name
    if "__deepcopy__" not in mc._BaseCache.__dict__:
        mc._BaseCache.__deepcopy__ = _deepcopy  # type: ignore[attr-defined]  # added on purpose
    for cls in _subclasses(mc._BaseCache):
        if cls in _installed:
            continue
        _installed.add(cls)
        own = cls.__dict__
        if "__init__" in own:
            type.__setattr__(cls, "__init__", _wrap_init(cls, own["__init__"]))
        for name in METHODS:
            member = own.get(name)
            if isinstance(member, classmethod):
                type.__setattr__(cls, name, _wrap_classmethod(cls, name, member.__func__))
            elif callable(member):
                type.__setattr__(cls, name, _wrap_method(name, member))
        for name in ("state", "meta_state"):
            member = own.get(name)
            if isinstance(member, property) and member.fset is not None:
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
        elif kind == "new":
            _, uid, path, args, kwargs = op
            self.objects[uid] = _resolve(path)(*self.decode(args), **self.decode(kwargs))
        elif kind == "copy":
            self.objects[op[2]] = copy.deepcopy(self.objects[op[1]])
        elif kind == "call":
            _, uid, name, args, kwargs, out = op
            got = getattr(self.objects[uid], name)(*self.decode(args), **self.decode(kwargs))
            self.bind(out, got)
        elif kind == "cls":  # on the class of this rank's own object where one is passed
            _, path, name, args, kwargs, out = op
            args, kwargs = self.decode(args), self.decode(kwargs)
            owner = _first_cache(args)
            klass = type(owner) if owner is not None else _resolve(path)
            self.bind(out, getattr(klass, name)(*args, **kwargs))
        elif kind == "make":
            from mlx_lm.models import cache as mc

            _, args, kwargs, out = op
            self.bind(out, mc.make_prompt_cache(_model, *self.decode(args),
                                                **self.decode(kwargs)))
        elif kind == "unreplayable":
            raise RuntimeError(f"rank 0 did what a follower cannot mirror: {op[1]}")
        else:
            raise RuntimeError(f"unknown cache operation {kind!r}")

    def caches(self, enc: Any) -> Any:
        return None if enc is None else self.decode(enc)


def _first_cache(value: Any) -> Any:
    if _is_cache(value):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_cache(item)
            if found is not None:
                return found
    return None


def _resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
