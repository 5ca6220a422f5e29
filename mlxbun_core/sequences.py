"""How far two sequences agree from the start: one helper for token ids (the prompt
cache's explanations, the SSD cache's lookups, a request's cache breakpoints) and for
text lines (the coding tools' diffs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Items = Sequence[Any] | np.ndarray


def common_prefix(a: Items, b: Items) -> int:
    """How many leading items ``a`` and ``b`` share. Token ids (numpy arrays, or sequences
    of ints) compare in one vectorized pass, as they do on the request path; other items
    (lines of text) one by one, stopping at the first difference."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    if _ids(a) and _ids(b):
        differ = np.flatnonzero(_array(a, m) != _array(b, m))
        return int(differ[0]) if differ.size else m
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), m)


def _ids(items: Items) -> bool:
    return isinstance(items, np.ndarray) or isinstance(items[0], int | np.integer)


def _array(items: Items, m: int) -> np.ndarray:
    """The first ``m`` items as an array (``np.fromiter`` reads a list of ints about three
    times faster than a Python loop compares it)."""
    if isinstance(items, np.ndarray):
        return items[:m]
    return np.fromiter(items, dtype=np.int64, count=m)
