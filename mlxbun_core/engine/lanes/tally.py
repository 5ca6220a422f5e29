"""What a lane counts of its own decode steps, for whoever reads the engine.

The batch lane (and a lone job's solo slot, with it) adds to a :class:`StepTally` once per
decode step: two integer adds, nothing else on the hot path. ``/metrics``
(:mod:`mlxbun_core.metrics.engine`) reads it at scrape time; the tally lives here, with
the lanes, so the engine never imports the metrics that observe it.
"""

from __future__ import annotations


class StepTally:
    """Decode steps of a lane and the rows they carried: plain integers the lane adds to
    once per step, read as counters at scrape time (mean occupancy = rows / steps)."""

    __slots__ = ("steps", "rows")

    def __init__(self) -> None:
        self.steps = 0
        self.rows = 0

    def add(self, rows: int) -> None:
        self.steps += 1
        self.rows += rows
