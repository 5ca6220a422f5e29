"""The SSD tier's settings (light: the CLI imports this without MLX)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
DEFAULT_MAX_BYTES = 50 * GIB
DEFAULT_FREE_SHARE = 0.25
DEFAULT_QUEUE_BYTES = 8 * GIB
DEFAULT_DEMOTE_IDLE_S = 300.0


@dataclass
class SsdConfig:
    """``--ssd-cache DIR`` and its sub-flags (``max_bytes`` None: the default cap).

    ``queue_bytes`` caps what queued writes may hold (the engine raises it to the RAM
    cap); ``write_behind`` writes published entries while the engine is idle, not
    only when they leave RAM (``MLXBUN_SSD_WRITEBEHIND=0`` turns it off)."""

    dir: Path
    max_bytes: int | None = None
    verify: bool = False
    demote_idle_s: float = DEFAULT_DEMOTE_IDLE_S
    write_behind: bool = True
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    # --generation-checkpoint N: snapshot qualifying generations every N tokens (0: off)
    checkpoint_every: int = 0
