"""Each step's plan for the batch: which prompts read how much, and whether rows decode.

The scheduler only decides; the executor (``engine/batch/``) runs the plan. A plan is
plain data, so a distributed follower can replay exactly what the leader ran.

How much prompt a step reads: while nothing decodes, a chunk per prompt as large as the
pacer allows (time to first token is all that matters); while streams run, a token
budget shared by the prompts, so no stream freezes for long, growing with the number
of prompts waiting (their clients all wait for a first token). At most ``PREFILL_ROWS``
prompts read together, oldest first: 32 arrivals start in waves instead of all waiting
for one huge chunk (the median first token halves). Never more than the pacer allows,
so a cancel lands within about one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lanes.pace import PrefillPacer

PREFILL_ROWS = 8  # prompts prefilled together in one chunk
PREFILL_TOKENS = 2048  # tokens of one chunk (all its rows) while a few rows are decoding
PREFILL_TOKENS_MAX = 8192  # ... growing with the prompts waiting, up to this
IDLE_STEP = 2048  # tokens per row and chunk when nothing decodes


@dataclass(frozen=True)
class StepPlan:
    """One step: ``prefill`` maps a row to the prompt tokens it reads; ``decode`` says
    whether decoding rows take a step; ``asked`` is the chunk's token budget (for the
    pacer's measurement)."""

    prefill: dict[int, int] = field(default_factory=dict)
    decode: bool = False
    asked: int = 0


class Scheduler:
    """Plans steps from the rows' state and the pacer (``shared``: the chunk's budget
    while rows decode)."""

    def __init__(self, pacer: PrefillPacer, shared: int = PREFILL_TOKENS):
        self.pacer, self.shared = pacer, shared

    def plan(self, prompts: list[tuple[int, int]], decoding: int) -> StepPlan:
        """``prompts``: ``(uid, tokens left to read)`` of rows reading their prompt,
        oldest first; ``decoding``: rows decoding."""
        if not prompts:
            return StepPlan(decode=decoding > 0)
        rows = prompts[:PREFILL_ROWS]
        if decoding == 0:
            budget = IDLE_STEP * len(rows)
        else:
            budget = min(PREFILL_TOKENS_MAX, max(self.shared, 512 * len(prompts)))
        budget = self.pacer.chunk(budget)
        each = max(1, budget // len(rows))
        return StepPlan({uid: min(each, left) for uid, left in rows}, decoding > 0, budget)
