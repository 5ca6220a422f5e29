"""The engine's own batch: rows whose KV lives in fixed-size blocks of one pool per
model, and the passes that run them (``executor.py``), on mlx-lm's public API only.

- ``pool.py``: block bookkeeping (free list, reference counts, block tables).
- ``storage.py``: the blocks' keys and values per attention layer.
- ``view.py``: one forward pass as the layers see it (the cache protocol over blocks).
- ``layout.py``: which layers page, and moving KV to and from mlx-lm's own caches.
- ``states.py``: recurrent layers' state, batched by mlx-lm's own ``ArraysCache``.
- ``executor.py``, ``windows.py``: prefill chunks, decode steps, forced runs and drafts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .executor import Batch, Emit, Forcing
from .pool import BlockPool, BlockTable, OutOfBlocks

if TYPE_CHECKING:
    from ..admission import Admission
    from .layout import Slot

BLOCK_SIZE = 16  # positions per block
FIRST_BLOCKS = 64  # the pool's first size; it doubles as rows need more, up to its limit
NO_LIMIT = 1 << 40


def pool_for(slots: list[Slot], admission: Admission | None) -> BlockPool:
    """A block pool for a model with layers ``slots``: bounded by the KV room admission
    plans with (unbounded without admission: tests)."""
    limit = NO_LIMIT
    if admission is not None:
        per_block = max(1, math.ceil(admission.layout.bytes_per_token * BLOCK_SIZE))
        # every paged layer keeps every position here, sliding ones too: a rough bound,
        # refined by the executor once the first write tells the real bytes per block
        limit = max(FIRST_BLOCKS, admission.kv_room // per_block + 64)
    return BlockPool(BLOCK_SIZE, FIRST_BLOCKS, limit)


__all__ = ["Batch", "BlockPool", "BlockTable", "Emit", "Forcing", "OutOfBlocks", "pool_for"]
