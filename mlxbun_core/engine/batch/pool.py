"""The KV block pool's bookkeeping: which blocks are free, who holds each, and every
row's block table. Nothing here touches MLX: the arrays the blocks index live in
:mod:`.storage`, and this module only hands out numbers.

A block holds ``block_size`` consecutive token positions of one sequence, in every
layer at once (each layer's storage has a slot for every position of every block).
A row's :class:`BlockTable` lists its blocks in position order. Blocks are
reference-counted so several tables may share one (a prefix several rows start from):
a table writes only into blocks it holds alone, and asks for a private copy of a
shared block before writing into it (copy on write, :meth:`BlockTable.writable`).

Block 0 is never handed out: positions a forward pass computes but nobody keeps (the
padding of a ragged window) are written there, so a padded write never needs a branch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

TRASH = 0  # the block padded positions are written to


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than a request for them needs."""

    def __init__(self, wanted: int, free: int):
        super().__init__(f"KV pool exhausted: {wanted} blocks wanted, {free} free")
        self.wanted, self.free = wanted, free


class BlockPool:
    """``capacity`` blocks of ``block_size`` positions; block 0 is the trash block.

    ``capacity`` may grow (:meth:`grow`) up to ``limit`` blocks; the storage follows.
    Swapped-out blocks (:meth:`swapped`) are counted for ``/stats`` by whoever swaps.
    """

    def __init__(self, block_size: int, capacity: int, limit: int | None = None):
        if block_size < 1 or capacity < 2:
            raise ValueError("a pool needs a block size >= 1 and room for 2 blocks")
        self.block_size = block_size
        self.capacity = capacity
        self.limit = max(capacity, limit if limit is not None else capacity)
        self._refs = [0] * capacity
        self._refs[TRASH] = 1  # held by the pool itself, forever
        self._free = list(range(capacity - 1, 0, -1))  # popped from the end: low ids first

    # -- counts -------------------------------------------------------------------
    @property
    def free(self) -> int:
        """Blocks that can be handed out now without growing."""
        return len(self._free)

    @property
    def room(self) -> int:
        """Blocks that can be handed out, growing up to the limit if need be."""
        return len(self._free) + self.limit - self.capacity

    @property
    def used(self) -> int:
        return self.capacity - 1 - len(self._free)

    def free_at_top(self, floor: int = 0) -> int:
        """Free blocks above the highest held one and above block ``floor`` (what
        :meth:`trim` gives back)."""
        top = next((b for b in range(self.capacity - 1, 0, -1) if self._refs[b] > 0), 0)
        return max(0, self.capacity - 1 - max(1, top, floor))

    @property
    def shared(self) -> int:
        """Blocks held by more than one table (or table and prefix cache)."""
        return sum(1 for r in self._refs[1:] if r > 1)

    def stats(self, bytes_per_block: int = 0) -> dict[str, int]:
        """What ``/stats`` shows of the pool (``bytes_per_block``: 0 before the first write)."""
        return {"block_size": self.block_size, "capacity": self.capacity - 1,
                "limit": self.limit - 1, "used": self.used, "free": self.free,
                "shared": self.shared, "bytes_per_block": bytes_per_block,
                "bytes": (self.capacity - 1) * bytes_per_block}

    def refs(self, block: int) -> int:
        return self._refs[block]

    def blocks_for(self, positions: int) -> int:
        """How many blocks ``positions`` token positions take."""
        return -(-positions // self.block_size)

    # -- handing out and taking back --------------------------------------------------
    def grow(self, capacity: int) -> None:
        """Raise the capacity to ``capacity`` blocks (the storage must grow with it)."""
        capacity = min(capacity, self.limit)
        if capacity <= self.capacity:
            return
        self._refs.extend([0] * (capacity - self.capacity))
        self._free = list(range(capacity - 1, self.capacity - 1, -1)) + self._free
        self.capacity = capacity

    def compact(self) -> list[int]:
        """Renumber the held blocks 1..n, in their order, and shrink the capacity to them
        (an idle pool gives its storage back). The old id of each block kept, the trash
        block first: the storage moves to match (``Layout.keep``) and every holder's
        table is renumbered (:meth:`BlockTable.renumber`)."""
        return self._keep([b for b in range(1, self.capacity) if self._refs[b] > 0])

    def cut_top(self, floor: int = 0) -> list[int] | None:
        """Drop the free blocks above the highest held one, keeping blocks up to
        ``floor`` (nothing is renumbered): the old id of each block kept, as
        :meth:`compact`'s; None when there is nothing to drop."""
        drop = self.free_at_top(floor)
        if not drop:
            return None
        return self._keep(list(range(1, self.capacity - drop)))

    def _keep(self, held: list[int]) -> list[int]:
        """Keep ``held`` (ascending) as blocks 1..n (at least one block beside the trash)."""
        refs = [1] + [self._refs[b] for b in held]
        order = [TRASH, *held]
        if len(order) < 2:  # a pool keeps room for one block (an empty one: trash's copy)
            order.append(TRASH)
            refs.append(0)
        self._refs, self.capacity = refs, len(order)
        self._free = [b for b in range(self.capacity - 1, 0, -1) if refs[b] == 0]
        return order

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks, each held once. Raises :class:`OutOfBlocks` when fewer
        than ``n`` are free (the caller grows the pool, evicts or waits)."""
        if n > len(self._free):
            raise OutOfBlocks(n, len(self._free))
        got = [self._free.pop() for _ in range(n)]
        for b in got:
            self._refs[b] = 1
        return got

    def retain(self, blocks: Iterable[int]) -> None:
        """One more holder for each of ``blocks`` (a table or cache entry sharing them)."""
        for b in blocks:
            if self._refs[b] <= 0:
                raise ValueError(f"block {b} is not allocated")
            self._refs[b] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """One holder fewer for each of ``blocks``; a block nobody holds is free again."""
        for b in blocks:
            if b == TRASH:
                continue
            r = self._refs[b] - 1
            if r < 0:
                raise ValueError(f"block {b} released more often than held")
            self._refs[b] = r
            if r == 0:
                self._free.append(b)


@dataclass
class BlockTable:
    """One row's blocks in position order, and how many positions they hold."""

    pool: BlockPool
    blocks: list[int] = field(default_factory=list)
    length: int = 0  # positions written (valid KV)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.pool.block_size

    def reserve(self, length: int) -> list[int]:
        """Make room for ``length`` positions; the blocks newly taken (the caller's
        storage has nothing to do for them)."""
        need = self.pool.blocks_for(length) - len(self.blocks)
        if need <= 0:
            return []
        got = self.pool.allocate(need)
        self.blocks.extend(got)
        return got

    def cost(self, start: int, end: int) -> int:
        """Blocks that writing positions ``[start, end)`` takes from the pool: the new
        ones past the table's end and a private copy of each shared one it writes."""
        bs = self.pool.block_size
        shared = sum(1 for i in range(start // bs, min(len(self.blocks), -(-end // bs)))
                     if self.pool.refs(self.blocks[i]) > 1)
        return max(0, self.pool.blocks_for(end) - len(self.blocks)) + shared

    def writable(self, start: int, end: int) -> list[tuple[int, int]]:
        """Make the blocks under positions ``[start, end)`` this table's alone: every
        shared one is swapped for a fresh block. The ``(old, new)`` pairs whose contents
        the storage must copy before the write (copy on write)."""
        bs = self.pool.block_size
        copies = []
        for i in range(start // bs, min(len(self.blocks), -(-end // bs))):
            old = self.blocks[i]
            if self.pool.refs(old) > 1:
                (new,) = self.pool.allocate(1)
                self.pool.release([old])
                self.blocks[i] = new
                copies.append((old, new))
        return copies

    def share(self, length: int) -> BlockTable:
        """A new table over the first ``length`` positions of this one, its blocks held
        once more (nothing is copied)."""
        n = self.pool.blocks_for(length)
        blocks = self.blocks[:n]
        self.pool.retain(blocks)
        return BlockTable(self.pool, list(blocks), length)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions; blocks past them go back to the pool."""
        length = max(0, min(length, self.length))
        keep = self.pool.blocks_for(length)
        self.pool.release(self.blocks[keep:])
        del self.blocks[keep:]
        self.length = length

    def free(self) -> None:
        """Give every block back (the table is empty afterwards)."""
        self.pool.release(self.blocks)
        self.blocks = []
        self.length = 0

    def renumber(self, moved: dict[int, int]) -> None:
        """Follow a :meth:`BlockPool.compact`: each block's new id in ``moved``."""
        self.blocks = [moved[b] for b in self.blocks]

    def slots(self, start: int, end: int) -> list[int]:
        """The storage slot of each position in ``[start, end)`` (they must be reserved)."""
        bs = self.pool.block_size
        return [self.blocks[p // bs] * bs + p % bs for p in range(start, end)]
