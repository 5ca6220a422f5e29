"""A prefix-cache entry that is blocks in the pool: the KV a finished row left there.

A row that ends hands its block table to the prefix cache instead of copying its KV
out; the next request that starts with those tokens gets a table sharing the same
blocks (each block held once more: nothing copied). Writing into a shared block makes
a private copy of that one block first (``BlockTable.writable``), so a continuation
that diverges inside a block copies one block, never the prefix. Recurrent layers'
state, which cannot be paged, is kept beside the table as single-sequence caches.

The serial lane and the SSD tier speak mlx-lm caches: :meth:`BlockEntry.dense` reads
an entry back into fresh ones (a copy, as their own entries would be).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .layout import Layout
    from .pool import BlockTable


@dataclass
class Shared:
    """A prefix-cache hit for the batch: a table sharing an entry's blocks and a copy of
    its recurrent states (the row that takes them owns them)."""

    table: BlockTable
    states: list[Any]


class BlockEntry:
    """``table``'s blocks (held by this entry) over ``layout``'s pool, and the
    recurrent ``states`` at its last position."""

    def __init__(self, layout: Layout, table: BlockTable, states: list[Any]):
        self.layout, self.table, self.states = layout, table, states

    @property
    def length(self) -> int:
        return self.table.length

    @property
    def nbytes(self) -> int:
        """The bytes of the blocks it holds (shared ones counted in every holder)."""
        return len(self.table.blocks) * self.layout.bytes_per_block() + sum(
            int(a.nbytes) for s in self.states for a in s.cache if a is not None)

    @property
    def trimmable(self) -> bool:
        """Whether a prefix of it serves a prompt (no recurrent state to take back)."""
        return not self.layout.recurrent

    def share(self, n: int) -> tuple[BlockTable, list[Any]]:
        """A table over its first ``n`` positions (blocks held once more) and a copy of
        its recurrent states (only whole entries of recurrent models are shared)."""
        if n != self.length and not self.trimmable:
            raise ValueError("a prefix of a recurrent entry cannot be taken")
        return self.table.share(n), [self.layout.state_ops.copy(s) for s in self.states]

    def dense(self, n: int | None = None) -> list[Any]:
        """Its first ``n`` positions (all by default) as fresh mlx-lm caches."""
        import mlx.core as mx

        table, states = self.share(self.length if n is None else n)
        try:
            out = self.layout.export(table, states)
            mx.eval([c.state for c in out])  # holds no lazy read of the pool past now
            return out
        finally:
            table.free()

    def release(self) -> None:
        """Give its blocks back (it was evicted or replaced)."""
        self.table.free()
        self.states = []
