"""The grep tool: a model's regular expression over the workspace's text files, in linear
time and within a deadline.

The pattern is the model's, so Python's backtracking ``re`` would let one pattern run for
hours (``(a+)+$`` over 27 ``a`` and a ``!`` took 23 s, and each extra character doubles it)
while holding the GIL, which froze the whole server. RE2 (``google-re2``) matches in time
linear in the text and refuses what needs backtracking (lookarounds, backreferences) with a
clear error. Each file is searched as a whole, in bytes (one pass finds the next line that
may match; that line alone then decides), so a search of the 64 MiB cap takes well under a
second. The search also stops at :data:`DEADLINE_S` (partial results, ``timedOut``) or as
soon as its :class:`Budget` is cancelled (the turn was stopped).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import re2

from ..apptools import ToolFailed
from .files import MAX_FILE_BYTES
from .workspace import Workspace

DEADLINE_S = 10.0  # the whole search
MAX_MATCHES = 200
MAX_PATTERN = 500
MAX_GLOB = 500
MAX_SCAN_FILES = 5000
MAX_SCAN_BYTES = 64 * 1024 * 1024
MAX_LINE_SHOWN = 300
SKIP_DIRS = {".git", "node_modules", ".venv", "__pycache__"}
Regexp = Any  # a compiled re2 pattern (google-re2 ships no type information)


class Budget:
    """When a tool's work must stop: its deadline, or a cancel from the waiting side
    (checked between steps; a thread cannot be interrupted)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def spent(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is the model's error, not the log's
    return options


def compile_pattern(pattern: str) -> tuple[Regexp, Regexp | None]:
    """(the pattern for one line, the same in multi-line mode for a whole file, or None
    when the pattern could read differently there: it anchors to the text's ends with
    ``\\A`` or ``\\z``, or turns multi-line mode off)."""
    try:
        line = re2.compile(pattern, _options())
        whole = None if any(s in pattern for s in ("\\A", "\\z", "-m")) else \
            re2.compile("(?m)" + pattern, _options())
    except re2.error as exc:
        why = exc.args[0].decode("utf-8", "replace") if exc.args and \
            isinstance(exc.args[0], bytes) else str(exc)
        raise ToolFailed(f"pattern is not a regular expression RE2 accepts: {why} (RE2 "
                         "has no lookarounds or backreferences)") from None
    return line, whole


def matching_lines(data: bytes, line_rx: Regexp, whole_rx: Regexp | None,
                   budget: Budget) -> Iterator[tuple[int, bytes]]:
    """(number, text) of every line of ``data`` that ``line_rx`` matches. ``whole_rx``
    finds the next candidate line in one pass; a match that spans lines only makes its
    first line a candidate, which ``line_rx`` then rejects, and the search goes on from
    the next line, so no line is missed."""
    if whole_rx is None:
        lines = data.split(b"\n")
        if not lines[-1]:
            lines.pop()  # the text's last newline ends a line; it starts none
        for no, line in enumerate(lines, 1):
            if budget.spent():
                return
            if line_rx.search(line):
                yield no, line
        return
    pos, no = 0, 1
    while pos < len(data) and not budget.spent():
        found = whole_rx.search(data, pos)
        if found is None or found.start() == len(data) and data.endswith(b"\n"):
            return  # (the text's last newline ends a line; it starts none to match in)
        start = data.rfind(b"\n", 0, found.start()) + 1
        no += data.count(b"\n", pos, start)
        end = data.find(b"\n", found.start())
        end = len(data) if end < 0 else end
        if line_rx.search(data[start:end]):
            yield no, data[start:end]
        pos, no = end + 1, no + 1


def _files_under(ws: Workspace, top: Path) -> Iterator[Path]:
    """Regular files under ``top`` whose real path stays in the workspace (no link escapes)."""
    if top.is_file():
        yield top
        return
    for folder, dirs, files in os.walk(top):  # followlinks=False: linked folders are skipped
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            real = Path(os.path.realpath(os.path.join(folder, name)))
            if ws.inside(real) and real.is_file():
                yield real


def _text_bytes(path: Path) -> bytes | None:
    """The file's bytes with CRLF as LF, or None: too large, binary or unreadable."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    return None if b"\x00" in data[:8192] else data.replace(b"\r\n", b"\n")


def grep(ws: Workspace, args: dict, budget: Budget | None = None) -> dict:
    """``pattern`` (RE2 syntax) over the files under ``path`` (default: the workspace)
    whose path matches ``glob``; each match as ``file:line: text``."""
    budget = budget or Budget(DEADLINE_S)
    pattern, glob = args.get("pattern"), args.get("glob")
    if not isinstance(pattern, str) or not pattern:
        raise ToolFailed("pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN:
        raise ToolFailed(f"pattern is longer than {MAX_PATTERN} characters")
    if glob is not None and (not isinstance(glob, str) or len(glob) > MAX_GLOB):
        raise ToolFailed(f"glob must be a string of at most {MAX_GLOB} characters")
    line_rx, whole_rx = compile_pattern(pattern)
    top = ws.resolve(args.get("path"), default=".")
    matches: list[str] = []
    files = scanned = 0
    for path in _files_under(ws, top):
        if budget.spent():
            break
        if glob and not path.match(glob):
            continue
        data = _text_bytes(path)
        if data is None:
            continue
        files, scanned = files + 1, scanned + len(data)
        if files > MAX_SCAN_FILES or scanned > MAX_SCAN_BYTES:
            return {"matches": matches, "truncated": True}
        label = ws.relative(path)
        for no, line in matching_lines(data, line_rx, whole_rx, budget):
            text = line.decode("utf-8", "replace")
            matches.append(f"{label}:{no}: {text[:MAX_LINE_SHOWN]}")
            if len(matches) >= MAX_MATCHES:
                return {"matches": matches, "truncated": True}
    if budget.cancelled.is_set():
        raise ToolFailed("the search was stopped")
    if budget.spent():
        return {"matches": matches, "truncated": True, "timedOut": True,
                "note": f"the search stopped after {budget.seconds:g} s; narrow it with "
                        "path or glob"}
    return {"matches": matches, "truncated": False}
