"""Holding back text that may still become a marker.

Every streaming text filter (stop sequences and think markers in the engine, tool-call
markup in :mod:`mlxbun_core.toolcalls`) must never send text it may later want back, so
it keeps the end of its buffer that could still grow into one of its markers. This is
that one measurement, shared from below by both.
"""

from __future__ import annotations

from collections.abc import Iterable


def held_marker_prefix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best
