"""What a failed step had already moved on, handed out before its rows are preempted (a
mixin of :class:`~.pressure.Relief`): a fill's consumed token and forced run, a
constrained row's sampled next token. A row recomputed from its output then meets its
grammar where the grammar is."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from .slot import BatchRow, deliver

if TYPE_CHECKING:
    import mlx.core as mx

    from ..batch import Batch, Forcing
    from ..fill.forced import FillSession


class Settle:
    """Holds the runs a decode step's fill consumed until the step is done."""

    _rows: dict[int, BatchRow]
    _batch: Batch | None
    _consumed: dict[int, tuple[int, mx.array, list[int]]]

    def _recorded(self, batch: Batch, fills: dict[int, FillSession], runs: Forcing) -> Forcing:
        """The fill callback ``runs``, remembering each run it consumes until the step is
        done."""

        def record(uids: list[int], tokens: list[int]) -> dict[int, list[int]]:
            out = runs(uids, tokens)
            for uid, token in zip(uids, tokens):
                pending = batch.pending(uid) if uid in fills else None
                if pending is not None:
                    self._consumed[uid] = (token, pending[1], out.get(uid, []))
            return out

        return record

    def _settle(self, uids: list[int]) -> None:
        """Before rows ``uids`` are preempted, hand out what their grammar may already
        have consumed: a fill's token and forced run (the matcher moved past them), or a
        constrained row's next token (its processor reads it as the step's input). A row
        recomputed from its output then meets its grammar where the grammar is."""
        batch = self._batch
        for uid in uids:
            row = self._rows.get(uid)
            if row is None or row.job.finished:
                continue
            job = row.job
            if uid in self._consumed:
                deliver(job, *self._consumed[uid])
            elif job.request.processors and batch is not None:
                pending = _pending(batch, uid)
                if pending is None:
                    continue
                deliver(job, *pending)
            if not job.finished and job.limit and \
                    job.session.usage.completion_tokens >= job.limit:
                job.close("length")
        self._consumed = {}


def _pending(batch: Batch, uid: int) -> tuple[int, mx.array] | None:
    """Row ``uid``'s sampled next token and its log-probs, read on the host; None when it
    has none, or when the step that sampled it failed (never handed out then)."""
    pending = batch.pending(uid)
    if pending is None:
        return None
    try:
        return cast(int, pending[0].item()), pending[1]
    except Exception:
        return None
