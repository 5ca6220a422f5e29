"""``sequences.common_prefix``: the one helper behind the prompt cache's explanations,
the SSD cache's lookups, cache breakpoints and the coding tools' diffs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mlxbun_core.sequences import common_prefix

CASES = [  # (a, b, shared)
    ([], [], 0),
    ([], [1, 2], 0),
    ([1, 2, 3], [1, 2, 3], 3),
    ([1, 2], [1, 2, 3, 4], 2),
    ([1, 2, 3, 4], [1, 2], 2),
    ([9, 2, 3], [1, 2, 3], 0),
    ([1, 2, 3], [1, 2, 4], 2),
    ([1, 2, 3, 5], [1, 2, 3, 4, 6], 3),
]
KINDS = {
    "lists": lambda s: list(s),
    "tuples": lambda s: tuple(s),
    "int32 arrays": lambda s: np.array(s, dtype=np.int32),
    "int64 arrays": lambda s: np.array(s, dtype=np.int64),
    "lines": lambda s: [f"line {x}\n" for x in s],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("a,b,shared", CASES)
def test_common_prefix(a, b, shared, kind):
    make = KINDS[kind]
    assert common_prefix(make(a), make(b)) == shared


@pytest.mark.parametrize("a,b,shared", CASES)
def test_a_list_against_an_array(a, b, shared):
    """The SSD cache compares stored arrays with a prompt that may arrive as a list."""
    assert common_prefix(list(a), np.array(b, dtype=np.int32)) == shared
    assert common_prefix(np.array(a, dtype=np.int32), list(b)) == shared


def test_agrees_with_a_plain_walk():
    """Random pairs diverging anywhere (or nowhere) against the obvious loop."""
    rng = random.Random(7)
    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(40))]
        b = a[:rng.randrange(len(a) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(5))]
        walk = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == walk
        assert common_prefix(np.array(a, dtype=np.int32), np.array(b, dtype=np.int32)) == walk
        assert common_prefix([str(x) for x in a], [str(x) for x in b]) == walk


def test_lines_that_look_like_numbers_stay_text():
    """Text lines never go through an integer array (``"01"`` and ``"1"`` differ)."""
    assert common_prefix(["01", "2"], ["1", "2"]) == 0
