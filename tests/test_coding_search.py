"""The coding tools' grep: RE2 over whole files must find exactly the lines a line-by-line
search finds, refuse what RE2 cannot do with a clear message, and stop at its budget."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mlxbun_core.webchat.apptools import ToolFailed
from mlxbun_core.webchat.coding import search
from mlxbun_core.webchat.coding.workspace import Workspace

PIECES = ["a", "b", "ab", "a+", "b*", ".", "^", "$", "\\b", "\\s", "[ab]", "[^a]", "(a|b)",
          "(ab)+", "x?", " ", "\\n", "\\s*", "(?s).", "(?i)A"]


def by_line(data: bytes, pattern: str) -> list[int]:
    """What grep means: the numbers of the lines Python's re finds the pattern in."""
    lines = data.split(b"\n")
    if not lines[-1]:
        lines.pop()
    rx = re.compile(pattern.encode())
    return [no for no, line in enumerate(lines, 1) if rx.search(line)]


@settings(max_examples=300, deadline=None)
@example(text="a\naa", parts=["a", "\\s*", "a"])  # a match across lines hides line 2's own
@example(text="ab\nbb", parts=["b", "\\s*", "b"])
@example(text="a\n", parts=["^", "$"])  # the last newline starts no line to match in
@given(text=st.text(alphabet="ab x\n\r", max_size=60),
       parts=st.lists(st.sampled_from(PIECES), min_size=1, max_size=4))
def test_whole_file_search_finds_exactly_the_matching_lines(text, parts):
    pattern = "".join(parts)
    if "(?s)" in pattern[1:] or "(?i)" in pattern[1:]:
        pattern = pattern.replace("(?s)", "").replace("(?i)", "")  # flags lead, as re wants
    data = text.encode().replace(b"\r\n", b"\n")
    line_rx, whole_rx = search.compile_pattern(pattern)
    assert whole_rx is not None
    found = [no for no, _ in search.matching_lines(data, line_rx, whole_rx, search.Budget(60))]
    assert found == by_line(data, pattern), pattern
    one_by_one = search.matching_lines(data, line_rx, None, search.Budget(60))
    assert [no for no, _ in one_by_one] == found


def test_patterns_re2_cannot_run_are_refused_clearly():
    for pattern in ("(a)\\1", "(?<=a)b", "a(?=b)"):
        with pytest.raises(ToolFailed, match="RE2"):
            search.compile_pattern(pattern)


def test_catastrophic_backtracking_patterns_run_in_linear_time(tmp_path):
    (tmp_path / "a.txt").write_text(("a" * 5000 + "!\n") * 200 + "aaa\n")
    ws = Workspace(tmp_path)
    started = time.monotonic()
    result = search.grep(ws, {"pattern": "(a+)+$"})
    assert time.monotonic() - started < 2  # Python's re: 23 s for 27 a's, doubling per a
    assert result == {"matches": ["a.txt:201: aaa"], "truncated": False}


def test_the_budget_stops_the_search_with_partial_results(tmp_path):
    for i in range(50):
        (tmp_path / f"f{i:02}.txt").write_text("hit\n")
    ws = Workspace(tmp_path)
    spent = search.Budget(0.0)
    result = search.grep(ws, {"pattern": "hit"}, spent)
    assert result["timedOut"] and result["truncated"] and "narrow it" in result["note"]
    assert len(result["matches"]) < 50
    stopped = search.Budget(60)
    stopped.cancel()
    with pytest.raises(ToolFailed, match="stopped"):
        search.grep(ws, {"pattern": "hit"}, stopped)
