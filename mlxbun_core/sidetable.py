"""What we know about objects that are not ours, kept beside them instead of on them.

An attribute of our own set on an mlx-lm object (a model, a cache) could collide with a
name a later release gives that class, and is invisible to anyone reading the library's
code. A :class:`SideTable` holds the value in a table of ours instead, keyed by the
object's identity and dropped when the object is collected. ``weakref.WeakKeyDictionary``
cannot do this for every object we meet: an ``mlx.nn.Module`` is a ``dict`` subclass,
so it is unhashable.
"""

from __future__ import annotations

import threading
import weakref
from typing import Generic, TypeVar

V = TypeVar("V")


class SideTable(Generic[V]):
    """``obj -> value`` by identity, for as long as ``obj`` lives (it must take weak
    references, as every Python class without ``__slots__`` does)."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref[object], V]] = {}
        self._lock = threading.Lock()

    def get(self, obj: object) -> V | None:
        """The value kept for ``obj``, or None."""
        item = self._items.get(id(obj))
        if item is None or item[0]() is not obj:
            return None
        return item[1]

    def set(self, obj: object, value: V) -> None:
        key = id(obj)

        def forget(_: weakref.ref[object]) -> None:  # runs as obj dies, before its id is reused
            with self._lock:
                self._items.pop(key, None)

        with self._lock:
            self._items[key] = (weakref.ref(obj, forget), value)

    def __len__(self) -> int:
        return len(self._items)
