"""Every change the engine makes to mlx-lm's single-sequence caches between forward passes.

The serial lane, the lone stream, the prefix cache and its SSD tier hold mlx-lm's own
cache objects (``KVCache``, ``ArraysCache``, ``CacheList`` ...). Besides the forward
passes that write them, they are made, copied (the prefix cache's private copies), cut
back (a prefix hit longer than the prompt, a rejected draft) and compacted, rebuilt
from saved arrays (the SSD tier) or put back from a snapshot (a recurrent layer after
rejected MTP drafts), and nothing else: each of those goes through a function here,
never straight to mlx-lm. Under ``--distributed`` rank 0 installs a :class:`Recorder`
(``distributed/mirror.py``) that sees each call, so the other ranks can put their own
shards' caches through the same; no mlx-lm class is patched for it.
``tests/test_cache_facade.py`` fails on a module that goes around these functions.

The batch lane's caches are not these: its KV lives in the engine's block pool and its
recurrent states in merged caches of its own, recorded by its journal
(``engine/batch/journal.py``).
"""

from __future__ import annotations

import copy as _copy
from typing import Any, Protocol, TypeVar, cast

T = TypeVar("T")


class Recorder(Protocol):
    """Sees each cache operation (rank 0 under ``--distributed``)."""

    def made(self, caches: list[Any]) -> None: ...

    def copied(self, source: Any, new: Any) -> None: ...

    def trimmed(self, caches: list[Any], n: int) -> None: ...

    def compacted(self, caches: list[Any]) -> None: ...

    def unreplayable(self, what: str) -> None: ...


_recorder: Recorder | None = None


def record_with(recorder: Recorder | None) -> None:
    """Have ``recorder`` see every later operation (None: nobody does)."""
    global _recorder
    _recorder = recorder


def make(model: Any) -> list[Any]:
    """A fresh cache per layer of ``model`` (mlx-lm's ``make_prompt_cache``)."""
    from mlx_lm.models.cache import make_prompt_cache

    caches: list[Any] = make_prompt_cache(model)
    if _recorder is not None:
        _recorder.made(caches)
    return caches


def copy(cache: T) -> T:
    """A private deep copy of ``cache`` (one cache object or a list of them)."""
    new = _copy.deepcopy(cache)
    if _recorder is not None:
        _recorder.copied(cache, new)
    return new


def trim(cache: list[Any], n: int) -> int:
    """Cut the last ``n`` positions off every layer of ``cache``; how many were cut
    (mlx-lm's ``trim_prompt_cache``: 0 when a layer cannot rewind)."""
    from mlx_lm.models.cache import trim_prompt_cache

    # mlx-lm annotates a list; it returns the count its first layer cut
    cut = cast("int", trim_prompt_cache(cache, n))
    if _recorder is not None:
        _recorder.trimmed(cache, n)
    return cut


def compact(cache: list[Any]) -> None:
    """Let each plain ``KVCache`` layer of ``cache`` hold only the positions it keeps (a
    trimmed one otherwise keeps its whole buffer); rotating and quantized layers keep
    their own layout. What the cache holds does not change, only its bytes."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    for c in cache:
        keys = c.keys if type(c) is KVCache else None
        if keys is not None and keys.shape[2] > c.offset:
            c.keys = mx.contiguous(keys[..., :c.offset, :])
            c.values = mx.contiguous(c.values[..., :c.offset, :])
    if _recorder is not None:
        _recorder.compacted(cache)


def restore_arrays(cache: Any, arrays: list[Any]) -> None:
    """Put back the arrays a recurrent layer (``ArraysCache``) held before a window of
    drafts (a snapshot: arrays are immutable, so the references are the copy). Only the
    MTP stream does this, which a distributed serve refuses: a recorder is told it
    cannot be mirrored."""
    if _recorder is not None:
        _recorder.unreplayable(f"a {type(cache).__name__} put back from a snapshot")
    cache.cache = list(arrays)


def from_state(cls: Any, state: Any) -> Any:
    """A cache of class ``cls`` holding ``state`` (arrays saved earlier: the SSD tier's
    restore, blocks exported into mlx-lm's layout). No other rank holds this rank's
    arrays, so a recorder is told that this cannot be mirrored."""
    if _recorder is not None:
        _recorder.unreplayable(f"a {cls.__name__} rebuilt from saved arrays")
    return cls.from_state(state)
