"""Which of a model's layers page their KV, and how KV crosses between the pool and
mlx-lm's own single-sequence caches.

``make_prompt_cache(model)`` says what each layer keeps: ``KVCache`` (full attention)
and ``RotatingKVCache`` (a sliding window) are paged, the window becoming a mask, and so
is a ``CacheList`` of ``KVCache`` (a layer with several, such as an attention layer and
its sparse-attention indexer: each part gets its own storage over the same blocks);
``ArraysCache`` (recurrent state: gated DeltaNet, Mamba) is a fixed-size state per row
that cannot be paged and stays a batch of mlx-lm's own caches (``states.py``). A model
with any other cache kind is not batched here (:func:`layout` answers None).

The prefix cache, the SSD tier and the lone stream hold mlx-lm caches; :meth:`Layout.load`
writes one into a row's blocks and :meth:`Layout.export` reads a row's blocks back into
fresh ones, through the cache classes' public constructors and attributes only.

Under a KV scheme (``--kv-quant``) the layers mlx-lm quantizes (plain ``KVCache``) keep
quantized blocks (``quantized.py``), each at the bits the scheme gives its cache index
(``kv_config.json``), and cross as mlx-lm's ``QuantizedKVCache`` (rotated ones, turbo,
as :class:`~mlxbun_core.kvquant.turbo.TurboKVCache`); the rest
(sliding windows, ``CacheList`` parts) keep their dtype, as mlx-lm leaves them.

With a journal (``journal.py``: a distributed serve's rank 0) a layout writes down every
change it makes between forward passes (growth, copy-on-write block copies, recurrent
state operations) and every pass's cache objects carry the pass as plain data, so that
a follower's own layout goes through the same. Loads and exports carry this process's
KV alone and are refused there, and so are quantized blocks (a KV scheme is not
replayed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ... import cache_ops
from ...kvquant import OFF, KVScheme
from ...kvquant.turbo import TurboKVCache
from .quantized import QuantizedStore, layer_for
from .states import StateOps, copy_state
from .storage import LayerStore

if TYPE_CHECKING:
    from .journal import Journal
    from .pool import BlockPool, BlockTable
    from .view import Window

PAGED, RECURRENT = "paged", "recurrent"

Store = LayerStore | QuantizedStore


@dataclass(frozen=True)
class Slot:
    """One layer's kind: ``paged`` (with ``window`` for a sliding layer, ``parts`` for a
    ``CacheList`` of that many) or ``recurrent`` (``size``: the state's arrays)."""

    kind: str
    window: int | None = None
    size: int = 0
    parts: int = 0


def layout(model: Any) -> list[Slot] | None:
    """Each layer's :class:`Slot`, or None when some layer keeps a cache kind the batch
    cannot hold."""
    return slots_of(cache_ops.make(model))


def slots_of(caches: list[Any]) -> list[Slot] | None:
    """:func:`layout` for a list of mlx-lm caches (a model's, or an MTP head's)."""
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

    slots = []
    for c in caches:
        if type(c) is CacheList and all(type(p) is KVCache for p in c.caches):
            slots.append(Slot(PAGED, parts=len(c.caches)))
        elif type(c) is KVCache:
            slots.append(Slot(PAGED))
        elif type(c) is RotatingKVCache and not c.keep:
            slots.append(Slot(PAGED, window=c.max_size))
        elif type(c) is ArraysCache:
            slots.append(Slot(RECURRENT, size=len(c.cache)))
        else:
            return None
    return slots


class Layout:
    """The pool's storage for every paged layer of one model, quantized by ``kv``
    (``journal``: see above)."""

    def __init__(self, slots: list[Slot], pool: BlockPool, kv: KVScheme = OFF,
                 journal: Journal | None = None):
        if journal is not None and kv.enabled:
            raise ValueError("quantized KV blocks (--kv-quant) cannot be replayed by the "
                             "other ranks")
        self.slots, self.pool, self.journal = slots, pool, journal
        # a store per paged layer (a list of them for a CacheList), None for recurrent
        self.stores: list[Store | list[LayerStore] | None] = [
            None if s.kind != PAGED else
            [LayerStore(pool) for _ in range(s.parts)] if s.parts else _store(s, i, pool, kv)
            for i, s in enumerate(slots)]
        self.recurrent = [i for i, s in enumerate(slots) if s.kind == RECURRENT]
        self.state_ops = StateOps([slots[i].size for i in self.recurrent], journal)
        self.name = journal.layout(self) if journal is not None else 0

    @property
    def schemed(self) -> bool:
        """Whether the layout was made under a KV scheme (some store may quantize)."""
        return any(isinstance(s, QuantizedStore) for s in self.stores)

    @property
    def quantized(self) -> bool:
        """Whether some layer keeps quantized blocks (or may: before its first write)."""
        return any(isinstance(s, QuantizedStore) and s.quantized is not False
                   for s in self.stores)

    def all_stores(self) -> list[Store]:
        out: list[Store] = []
        for s in self.stores:
            if isinstance(s, list):
                out += s
            elif s is not None:
                out.append(s)
        return out

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.all_stores())

    def bytes_per_block(self) -> int:
        return sum(s.bytes_per_block() for s in self.all_stores())

    def regrown_bytes(self) -> int:
        """Bytes of storage a growth frees as it copies (:meth:`grow`): all the pool's
        storage but its widest layer's."""
        sizes = [s.nbytes for s in self.all_stores()]
        return sum(sizes) - max(sizes, default=0)

    def grow(self, capacity: int) -> None:
        """Grow every layer's storage to ``capacity`` blocks, one layer at a time: each
        copy is evaluated before the next begins, so a layer's old storage is freed (to
        MLX's cache) as its copy is made and the growth peaks at one layer's old storage
        beside the new (``Governor.pool_limit`` counts on it)."""
        self.pool.grow(capacity)
        for s in self.all_stores():
            s.fit()
            mx.eval(s.arrays())
        if self.journal is not None:
            self.journal.add(("grow", self.name, capacity))

    def keep(self, order: list[int]) -> None:
        """Move the storage to a compacted or trimmed pool (``BlockPool.compact``/``trim``
        returned ``order``), one layer at a time as :meth:`grow` does: each layer's old
        arrays are let go before the next layer's new ones are made. Not journaled: the
        lane gives memory back only where no other rank replays it."""
        if self.journal is not None:
            raise RuntimeError("moving the pool's blocks cannot be replayed by the other ranks")
        for s in self.all_stores():
            s.keep(order)
            mx.eval(s.arrays())

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:  # (the common case: the executor asks for every row every step)
            return
        for s in self.all_stores():
            s.copy_blocks(pairs)
        if self.journal is not None:
            self.journal.add(("copy_blocks", self.name, pairs))

    def fresh_states(self) -> list[Any]:
        """New, empty recurrent caches for one row (one per recurrent layer)."""
        return self.state_ops.fresh()

    def caches(self, view: Window, states: list[Any]) -> list[Any]:
        """The per-layer cache objects of one pass over ``view``: the paged layers'
        over their stores, the recurrent layers' ``states`` in order. With a journal
        the list also carries the pass as plain data (``journal.Pass``)."""
        from mlx_lm.models.cache import CacheList

        rec = iter(states)
        # a pass whose rows all start empty attends as mlx-lm's first pass under a KV scheme
        first = self.quantized and not view.starts.any()
        out = [next(rec) if store is None else
               CacheList(*(layer_for(s, view, None, first) for s in store))
               if isinstance(store, list) else layer_for(store, view, slot.window, first)
               for slot, store in zip(self.slots, self.stores)]
        if self.journal is None:
            return out
        return self.journal.pass_of(self.name, out, view.plan(), states)

    def arrays(self, states: list[Any]) -> list[Any]:
        """What a pass leaves to evaluate: the stores' arrays and those of the
        recurrent ``states``."""
        out: list[Any] = [a for s in self.all_stores() for a in s.arrays()]
        for c in states:
            out += [a for a in c.cache if a is not None]
        return out

    def _local(self, what: str) -> None:
        """Refuse a crossing that carries this process's KV alone (a journaled layout:
        followers could not do the same)."""
        if self.journal is not None:
            raise RuntimeError(f"{what} cannot be replayed by the other ranks")

    # -- crossing to and from mlx-lm's caches ------------------------------------------
    def load(self, table: BlockTable, cache: list[Any], length: int) -> list[Any]:
        """Write the first ``length`` positions of a single sequence's mlx-lm ``cache``
        into ``table`` (reserved here); the row's recurrent states (copies: the caller's
        cache stays as it was)."""
        self._local("loading an mlx-lm cache into the block pool")
        table.reserve(length)
        slots = mx.array(table.slots(0, length), dtype=mx.int32) if length else None
        states = []
        for slot, store, c in zip(self.slots, self.stores, cache):
            if store is None:
                states.append(copy_state(c))
            elif slots is None:
                continue
            elif isinstance(store, list):
                for part_store, part in zip(store, c.caches):
                    _load_kv(part_store, part, Slot(PAGED), table, slots, length)
            else:
                _load_kv(store, c, slot, table, slots, length)
        table.length = length
        return states

    def export(self, table: BlockTable, states: list[Any]) -> list[Any]:
        """The row's KV as a fresh single-sequence mlx-lm cache (its recurrent layers
        from ``states``, copied)."""
        from mlx_lm.models.cache import CacheList

        self._local("reading blocks out into mlx-lm caches")
        out: list[Any] = []
        rec = iter(states)
        for slot, store in zip(self.slots, self.stores):
            if store is None:
                out.append(copy_state(next(rec)))
            elif isinstance(store, list):
                out.append(CacheList(*(_export_kv(s, Slot(PAGED), table) for s in store)))
            else:
                out.append(_export_kv(store, slot, table))
        return out


def _store(slot: Slot, index: int, pool: BlockPool, kv: KVScheme) -> Store:
    """Layer ``index``'s store: quantized blocks where mlx-lm quantizes (plain full
    attention), at the bits the scheme gives that layer."""
    spec = kv.layer(index) if slot.window is None else None
    if spec is not None:
        return QuantizedStore(pool, spec.keys, spec.group_size, spec.values, spec.rotate)
    return LayerStore(pool)


def _load_kv(store: Store, c: Any, slot: Slot, table: BlockTable, slots: mx.array,
             length: int) -> None:
    """Write one layer's mlx-lm cache ``c`` into ``store`` at the table's slots."""
    if isinstance(store, QuantizedStore):  # a KVCache or a QuantizedKVCache
        store.write(slots, _first(c.keys, length), _first(c.values, length))
        return
    k, v = _temporal_kv(c, slot)
    held = k.shape[2]  # a sliding window holds only its last positions
    if held < length:  # earlier positions stay unwritten: outside the window
        part = mx.array(table.slots(length - held, length), dtype=mx.int32)
        store.write(part, k, v)
    else:
        store.write(slots, k[..., :length, :], v[..., :length, :])


def _first(a: Any, n: int) -> Any:
    """The first ``n`` positions of a cache's keys or values (a quantized triple too,
    which mlx-lm holds as a tuple or a list)."""
    if isinstance(a, (tuple, list)):
        return tuple(x[..., :n, :] for x in a)
    return a[..., :n, :]


def _export_kv(store: Store, slot: Slot, table: BlockTable) -> Any:
    """One layer's blocks as a fresh mlx-lm cache of the layer's kind."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

    if isinstance(store, QuantizedStore):
        if store.quantized is False:
            return _export_kv(store.plain, slot, table)
        if not table.length:  # nothing held: fresh, as mlx-lm's before its first pass
            return KVCache()
        qk, qv = store.export(table.blocks, table.length)
        if store.rotate:
            return cache_ops.from_state(TurboKVCache, (qk, qv, table.length, store.group_size,
                                                       store.bits, store.value_bits))
        return cache_ops.from_state(QuantizedKVCache, (qk, qv, table.length, store.group_size,
                                                       store.bits))
    k, v = store.export(table.blocks, table.length)
    if slot.window is None:
        c = KVCache()
        if table.length:
            c.update_and_fetch(k, v)
        return c
    r = RotatingKVCache(max_size=slot.window)
    start = max(0, table.length - slot.window)
    k, v = k[..., start:, :], v[..., start:, :]
    if k.shape[2]:
        r.update_and_fetch(k, v)
    r.offset = table.length  # positions seen, not positions kept
    return r


def _temporal_kv(c: Any, slot: Slot) -> tuple[mx.array, mx.array]:
    """An mlx-lm cache's keys and values in position order (a rotating cache's last
    ``max_size`` positions, unrolled from its ring)."""
    if slot.window is None:
        return c.keys[..., :c.offset, :], c.values[..., :c.offset, :]
    keys, values, offset, _, _, idx = c.state  # (keep is 0: see ``layout``)

    def ordered(a: mx.array) -> mx.array:
        if idx == a.shape[2]:
            return a
        if idx < offset:
            return mx.concatenate([a[..., idx:, :], a[..., :idx, :]], axis=2)
        return a[..., :idx, :]

    return ordered(keys), ordered(values)

