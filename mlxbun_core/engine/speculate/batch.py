"""Prompt-lookup speculation on the batch lane: every row proposes its own drafts, rows
without one decode normally, all in the same forward pass.

A row's drafts are its lookup's guesses of the tokens after its next one; the batch's
decode step feeds them in a window after that token and keeps each row's accepted
prefix (``engine/batch/windows.py``: no copy, a rejected draft is just a shorter
block table). A step only carries drafts when some row's drafts are landing (the same
free check as the lone stream's: its lookups guessed the tokens actually sampled,
twice in a row); otherwise the batch takes its ordinary pipelined step, since a window
makes the step wait for the host to verify.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import SpecConfig
from .gate import LandingGate
from .lookup import PromptLookup
from .stream import SpecTally


@dataclass
class _Row:
    lookup: PromptLookup
    config: SpecConfig
    usage: dict[str, int]
    proposal: list[int] = field(default_factory=list)
    gate: LandingGate = field(default_factory=LandingGate)  # checked on every token


class BatchSpeculator:
    """Per-row prompt lookup for a batch lane's rows (by BatchGenerator uid)."""

    def __init__(self, tally: SpecTally | None = None, extra_positions: int | None = None):
        self.rows: dict[int, _Row] = {}
        self.tally = tally
        # padded positions a speculative step may add over a plain one (all rows together)
        self.extra_positions = (default_extra_positions() if extra_positions is None
                                else extra_positions)

    def add(self, uid: int, config: SpecConfig, history: list[int], usage: Any) -> None:
        """Track row ``uid`` (``history``: every token before its pending one)."""
        if usage.speculation is None:
            usage.speculation = {"drafted": 0, "accepted": 0, "targetCalls": 0}
            if self.tally is not None:
                self.tally.requests += 1
        row = _Row(PromptLookup(history, config.ngram_max, config.ngram_min), config,
                   usage.speculation)
        row.proposal = row.lookup.propose(config.num_draft_tokens + 1)
        self.rows[uid] = row

    def drop(self, uid: int) -> None:
        self.rows.pop(uid, None)

    def retain(self, uids: Any) -> None:
        """Forget rows that left the batch some other way (the lone-stream hand-off)."""
        for uid in [u for u in self.rows if u not in uids]:
            del self.rows[uid]

    def observe(self, uid: int, token: int) -> None:
        """A token the row emitted: the free check of its last lookup, then the next."""
        row = self.rows.get(uid)
        if row is None:
            return
        row.gate.checked(bool(row.proposal) and row.proposal[0] == token)
        row.lookup.extend([token])
        row.proposal = row.lookup.propose(row.config.num_draft_tokens + 1)

    def stepped(self, uids: set[int]) -> None:
        """Rows that took part in a forward pass (``targetCalls``)."""
        for uid in uids:
            row = self.rows.get(uid)
            if row is not None:
                row.usage["targetCalls"] += 1
        if self.tally is not None and uids:
            self.tally.target_calls += 1

    def drafts(self, uids: list[int]) -> dict[int, list[int]]:
        """Each row's drafts for the next step of the decoding rows ``uids`` (empty
        when no row has any worth sending). The window is as wide as the longest hot
        row's drafts, within ``extra_positions`` padded positions for the whole batch;
        other rows fill the width with whatever their lookup has (those positions are
        computed anyway)."""
        rows = [self.rows.get(uid) for uid in uids]
        hot = [len(r.proposal) - 1 for r in rows if r is not None and r.gate.hot
               and len(r.proposal) > 1]
        if not hot:
            return {}
        room = max(1, self.extra_positions // max(1, len(rows)))
        width = min(max(hot), room, *(r.config.num_draft_tokens for r in rows if r))
        if self.tally is not None:
            self.tally.batch_steps += 1
        return {uid: r.proposal[1:1 + width] for uid, r in zip(uids, rows)
                if r is not None and len(r.proposal) > 1}

    def count(self, uid: int, drafted: int, accepted: int) -> None:
        """Row ``uid``'s drafts in the last step: how many were fed, how many kept."""
        row = self.rows.get(uid)
        if row is not None:
            row.usage["drafted"] += drafted
            row.usage["accepted"] += accepted
        if self.tally is not None:
            self.tally.drafted += drafted
            self.tally.accepted += accepted
            self.tally.rounds += 1 if drafted else 0


def default_extra_positions() -> int:
    """``MLXBUN_SPEC_BATCH_POSITIONS``, else by backend. A GPU step is bound by reading the
    weights, so some extra draft positions ride along nearly free; measured on an H200 (8B
    bf16, 8 rows, paired rounds), 32 (4 drafts a row) gave 1.35x plain batched decoding
    where 96 and 256 (10 a row) gave 1.04-1.06x: a wider window mostly pays for drafts that
    are rejected. A CPU step is compute-bound from the start."""
    import mlx.core as mx

    from ...runconfig import current

    set_to = current().speculation.batch_positions
    if set_to is not None:
        return set_to
    return 32 if mx.default_device() == mx.gpu else 16
