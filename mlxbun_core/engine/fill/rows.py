"""Forced runs on the batch lane: rows with a run and rows without share one forward.

While any decoding row has a fill session, the batch's decode step reads every row's
next token on the host, asks each fill session for the grammar's forced run after it
(:func:`forcing`), and feeds ``[token, *run]`` in a window (``engine/batch/windows.py``):
the run's positions are kept, padding is masked, and each row samples from the logits
at its own last real position.

Rows without a run pay ``width - 1`` padded positions of compute. On a GPU at decode
batch sizes a step is bandwidth-bound, so a wider one costs about the same. On the CPU
compute grows with the width and the plain rows pay for the padding: measured
(bench/NOTES.md, 8 rows, tiny checkpoint) a mixed batch was 1.03x (JSON) and 0.63x
(tool calls) with shared runs, the plain rows at 0.4x their tok/s. So the CPU keeps one
token per step in the batch (fill still runs for a lone stream and on the serial lane,
where it pays); the tokens still go through the fill sessions, which keep the grammar
matchers in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from ...runconfig import current

if TYPE_CHECKING:
    from ..batch import Forcing
    from .forced import FillSession

CPU_STEP_TOKENS = 0
GPU_STEP_TOKENS = 512


def step_tokens() -> int:
    """Query positions one shared fill step may run (rows x width):
    ``MLXBUN_FILL_BATCH_TOKENS``, else none on the CPU and 512 on a GPU."""
    set_to = current().engine.fill_batch_tokens
    if set_to is not None:
        return set_to
    return CPU_STEP_TOKENS if mx.default_device() == mx.cpu else GPU_STEP_TOKENS


def forcing(fills: dict[int, FillSession]) -> Forcing:
    """The batch's forcing callback over the rows' fill sessions (uid -> session)."""

    def runs(uids: list[int], tokens: list[int]) -> dict[int, list[int]]:
        cap = max(0, step_tokens() // max(1, len(uids)) - 1)  # the longest run a step carries
        out = {}
        for uid, token in zip(uids, tokens):
            fill = fills.get(uid)
            if fill is not None:
                out[uid] = fill.after(token, cap)
        return out

    return runs
