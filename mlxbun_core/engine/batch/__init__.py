"""The engine's own batch: rows whose KV lives in fixed-size blocks of one pool per
model, and the passes that run them (``executor.py``), on mlx-lm's public API only.

- ``pool.py``: block bookkeeping (free list, reference counts, block tables).
- ``storage.py``: the blocks' keys and values per attention layer.
- ``quantized.py``: quantized blocks under a KV scheme (``--kv-quant``).
- ``view.py``: one forward pass as the layers see it (the cache protocol over blocks).
- ``layout.py``: which layers page, and moving KV to and from mlx-lm's own caches.
- ``states.py``: recurrent layers' state, batched by mlx-lm's own ``ArraysCache``.
- ``executor.py``, ``windows.py``: prefill chunks, decode steps, forced runs and drafts.
- ``direct.py``, ``attention.py``: attention straight over the blocks (a CUDA kernel).
- ``lean.py``: a decode step's graph with half the primitives, for llama-shaped models.
- ``tune.py``: which decode forward a batch runs (lean, fused or the model's), timed once.
- ``journal.py``, ``replay.py``: the batch as plain data (a journal on rank 0 of a
  distributed serve, replayed by the other ranks on pools of their own).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .executor import Batch
from .pool import BlockPool, BlockTable, OutOfBlocks
from .rows import Emit, Forcing

if TYPE_CHECKING:
    from ..admission import Admission
    from .layout import Slot

BLOCK_SIZE = 16  # positions per block
FIRST_BLOCKS = 64  # the pool's first size; it doubles as rows need more, up to its limit
NO_LIMIT = 1 << 40


def pool_for(slots: list[Slot], admission: Admission | None, cached_bytes: int = 0) -> BlockPool:
    """A block pool for a model with layers ``slots``: bounded by the KV room admission
    plans with, plus ``cached_bytes`` the prefix cache may keep in blocks (unbounded
    without admission: tests)."""
    limit = NO_LIMIT
    if admission is not None:
        per_block = max(1, math.ceil(admission.layout.bytes_per_token * BLOCK_SIZE))
        # every paged layer keeps every position here, sliding ones too: a rough bound
        limit = max(FIRST_BLOCKS, int(admission.kv_room + cached_bytes) // per_block + 64)
    return BlockPool(BLOCK_SIZE, FIRST_BLOCKS, limit)


__all__ = ["Batch", "BlockPool", "BlockTable", "Emit", "Forcing", "OutOfBlocks", "pool_for"]
