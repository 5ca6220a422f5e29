"""The file tools: read and ls run at once (grep is :mod:`.search`); edit and write are
planned first (a :class:`Change` with its unified diff, shown on the approval card) and
applied only after the user allows them, and only if the file still reads as it did when
planned."""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ...sequences import common_prefix
from ..apptools import ToolFailed
from . import shown
from .workspace import Workspace

MAX_READ_BYTES = 256 * 1024  # what read returns of one file
MAX_FILE_BYTES = 2 * 1024 * 1024  # files edit, write and grep will touch
MAX_LIST = 500
MAX_DIFF_CHARS = 64 * 1024
DIFF_LINES = 5000  # of each side's changed region given to difflib
CONTEXT = 3


def _text(args: dict, key: str, *, empty: bool = False) -> str:
    value = args.get(key)
    if not isinstance(value, str) or (not value and not empty):
        raise ToolFailed(f"{key} must be a {'' if empty else 'non-empty '}string")
    return value


def _read_text(path: Path, cap: int = MAX_FILE_BYTES) -> str:
    if not path.is_file():
        raise ToolFailed(f"{path.name!r} is not a file")
    if path.stat().st_size > cap:
        raise ToolFailed(f"{path.name!r} is larger than {cap} bytes")
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise ToolFailed(f"{path.name!r} is a binary file")
    return data.decode("utf-8", "replace")


def read(ws: Workspace, args: dict) -> dict:
    path = ws.resolve(args.get("path"))
    if not path.is_file():
        raise ToolFailed(f"{args.get('path')!r} is not a file")
    with path.open("rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    if b"\x00" in data[:8192]:
        raise ToolFailed(f"{args.get('path')!r} is a binary file")
    return {"path": ws.relative(path), "content": data[:MAX_READ_BYTES].decode("utf-8", "replace"),
            "truncated": len(data) > MAX_READ_BYTES}


def ls(ws: Workspace, args: dict) -> dict:
    path = ws.resolve(args.get("path"), default=".")
    if not path.is_dir():
        raise ToolFailed(f"{args.get('path')!r} is not a folder")
    names = sorted(os.listdir(path))
    entries = [n + ("/" if (path / n).is_dir() else "") for n in names[:MAX_LIST]]
    return {"path": ws.relative(path), "entries": entries, "truncated": len(names) > MAX_LIST}


@dataclass
class Change:
    """A planned edit or write: the file, what it holds now (None: absent), what it will."""

    path: Path
    label: str
    before: str | None
    after: str
    shown: str | None = field(default=None, repr=False, compare=False)  # the diff, once made

    def diff(self) -> str:
        """The unified diff the card shows: names quoted and control characters escaped
        (:mod:`.shown`), lines split at newlines only, as the card splits them. Made once
        (seconds for a large file: callers run it off the event loop)."""
        if self.shown is None:
            self.shown = self._diff()
        return self.shown

    def _diff(self) -> str:
        old, new = _lines(self.before or ""), _lines(self.after)
        # only the changed region (and its context) goes to difflib, at most DIFF_LINES of
        # each side: its matching is quadratic-ish, and the card shows 64 KiB anyway
        same = common_prefix(old, new)
        tail = common_prefix(old[same:][::-1], new[same:][::-1])
        start = max(0, same - CONTEXT)
        stops = [min(len(lines) - tail + CONTEXT, same + DIFF_LINES) for lines in (old, new)]
        cut = any(len(lines) - tail - same > DIFF_LINES for lines in (old, new))
        lines = difflib.unified_diff(
            old[start:stops[0]], new[start:stops[1]],
            "/dev/null" if self.before is None else shown.name(f"a/{self.label}"),
            shown.name(f"b/{self.label}"), n=CONTEXT)
        text = "".join(_hunk_from(line, start) if line.startswith("@@ ")
                       else shown.line(line[:-1]) + "\n" if line.endswith("\n")
                       else shown.line(line) + "\n\\ No newline at end of file\n"
                       for line in lines)
        if cut or len(text) > MAX_DIFF_CHARS:
            return text[:MAX_DIFF_CHARS] + "\n… (cut)\n"
        return text


_HUNK = re.compile(r"@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def _hunk_from(line: str, start: int) -> str:
    """A hunk header of a diff of lines from ``start`` on, numbered from the file's top."""
    def shift(m: re.Match) -> str:
        return (f"@@ -{int(m[1]) + start}{m[2] or ''} +{int(m[3]) + start}{m[4] or ''} @@")
    return _HUNK.sub(shift, line, count=1)


def _lines(text: str) -> list[str]:
    """``text``'s lines with their newlines; only ``\\n`` ends a line (``splitlines`` would
    also split at a form feed or U+2028, which the card shows inside a line)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def plan_edit(ws: Workspace, args: dict) -> Change:
    """Replace ``old_string`` by ``new_string``: it must occur exactly once, unless
    ``replace_all`` is true."""
    path = ws.resolve(args.get("path"))
    old, new = _text(args, "old_string"), _text(args, "new_string", empty=True)
    text = _read_text(path)
    count = text.count(old)
    if count == 0:
        raise ToolFailed("old_string does not occur in the file")
    if count > 1 and args.get("replace_all") is not True:
        raise ToolFailed(f"old_string occurs {count} times; make it unique or set replace_all")
    return Change(path, ws.relative(path), text, text.replace(old, new))


def plan_write(ws: Workspace, args: dict) -> Change:
    path = ws.resolve(args.get("path"))
    content = _text(args, "content", empty=True)
    if len(content.encode()) > MAX_FILE_BYTES:
        raise ToolFailed(f"content is larger than {MAX_FILE_BYTES} bytes")
    if path.is_dir():
        raise ToolFailed(f"{args.get('path')!r} is a folder")
    before = _read_text(path) if path.exists() else None
    return Change(path, ws.relative(path), before, content)


def apply(ws: Workspace, change: Change) -> dict:
    """Write ``change`` if the file is as planned: a temporary file in the same folder,
    then a rename (which replaces a link itself, never the file it points to)."""
    path = ws.resolve(change.label)  # again: the folder may have changed while we waited
    now = _read_text(path) if path.exists() else None
    if path != change.path or now != change.before:
        raise ToolFailed("the file changed after this call was planned; nothing was written")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not ws.inside(Path(os.path.realpath(path.parent))):
        raise ToolFailed("the file's folder leaves the workspace")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(change.after)
        if change.before is not None:
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"path": change.label, "bytes": len(change.after.encode()),
            "created": change.before is None}
