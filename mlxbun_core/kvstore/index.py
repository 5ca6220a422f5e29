"""What the SSD tier holds, in memory: namespace → entries (tokens, size, last use).

Built at start-up from a header-only scan of this server's fingerprint directory
(``<dir>/<fingerprint>/<namespace>/<id>.mlxkv``) and kept current by the writer.
Another process writing into the same directory is picked up lazily: a lookup
rescans a namespace directory whose mtime changed. Files are immutable once
named, so a file another process removed only turns a restore into a miss.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..sequences import common_prefix
from .fileformat import SUFFIX, CorruptEntry, maybe_remove, read_header, reap_orphans

log = logging.getLogger("mlxbun.kvstore")


@dataclass
class IndexEntry:
    path: Path
    ns: str
    tokens: np.ndarray  # int32
    nbytes: int  # the file's size
    used: float  # last use (the file's mtime; bumped on every restore)
    trimmable: bool

    @property
    def n(self) -> int:
        return int(self.tokens.size)


class Index:
    def __init__(self, root: Path, fingerprint: str):
        self.root = root  # the dir passed to --ssd-cache
        self.home = root / fingerprint  # this server's entries
        self._by_ns: dict[str, dict[Path, IndexEntry]] = {}
        self._seen_mtime: dict[str, int] = {}
        self._lock = threading.Lock()
        self.corrupt_removed = 0

    # -- loading ---------------------------------------------------------------------
    def scan(self) -> int:
        """Load every entry of this fingerprint (headers only); reap dead writers' temp
        files; remove files that fail their header checks. Returns the entry count."""
        try:
            names = [d.name for d in self.home.iterdir() if d.is_dir()]
        except OSError:
            return 0
        for ns in names:
            self.refresh(ns, force=True)
        return len(self)

    def refresh(self, ns: str, force: bool = False) -> None:
        """Re-read a namespace directory if it changed since we last looked."""
        d = self.home / ns
        try:
            mtime = os.stat(d).st_mtime_ns
        except OSError:
            with self._lock:
                self._by_ns.pop(ns, None)
            return
        if not force and self._seen_mtime.get(ns) == mtime:
            return
        self._seen_mtime[ns] = mtime
        reap_orphans(d)
        try:
            present = {p for p in d.iterdir() if p.suffix == SUFFIX and not p.name.startswith(".")}
        except OSError:
            return
        with self._lock:
            known = self._by_ns.setdefault(ns, {})
            for gone in [p for p in known if p not in present]:
                del known[gone]
            new = [p for p in present if p not in known]
        for p in new:
            entry = self._load(p, ns)
            if entry is not None:
                with self._lock:
                    self._by_ns.setdefault(ns, {})[p] = entry

    def _load(self, path: Path, ns: str) -> IndexEntry | None:
        try:
            h = read_header(path)
            if h.header.get("namespace") != ns or h.header.get("fingerprint") != self.home.name:
                raise CorruptEntry("foreign file in this directory")
            return IndexEntry(path, ns, h.tokens, h.size, os.stat(path).st_mtime,
                              bool(h.header.get("trimmable")))
        except CorruptEntry as exc:
            log.warning("ssd cache: removing %s (%s)", path, exc)
            self.corrupt_removed += 1
            maybe_remove(path)
        except OSError:
            pass  # removed under us, or unreadable: not indexed
        return None

    # -- queries ---------------------------------------------------------------------
    def find(self, ns: str, prompt: np.ndarray) -> tuple[IndexEntry, int] | None:
        """The entry giving the longest usable prefix of ``prompt`` and that length
        (capped at ``len(prompt) - 1``; an entry that would need a trim but cannot be
        trimmed is skipped, never restored and thrown away)."""
        self.refresh(ns)
        L = prompt.size
        best: tuple[IndexEntry, int] | None = None
        with self._lock:
            entries = list(self._by_ns.get(ns, {}).values())
        for e in entries:
            if not e.n or not L or e.tokens[0] != prompt[0]:
                continue
            c = common_prefix(e.tokens, prompt)
            if c == e.n and e.n <= L - 1:
                usable = e.n
            elif e.trimmable:
                usable = min(c, L - 1)
            else:
                continue
            if usable > 0 and (best is None or usable > best[1]
                               or (usable == best[1] and e.nbytes < best[0].nbytes)):
                best = (e, usable)
        return best

    def covering(self, ns: str, tokens: np.ndarray) -> IndexEntry | None:
        """An entry that already serves everything ``tokens`` would: the same tokens,
        or a trimmable entry they are a prefix of."""
        with self._lock:
            entries = list(self._by_ns.get(ns, {}).values())
        for e in entries:
            if e.n == tokens.size and np.array_equal(e.tokens, tokens):
                return e
            if e.trimmable and e.n > tokens.size and np.array_equal(e.tokens[:tokens.size], tokens):
                return e
        return None

    def superseded_by(self, ns: str, tokens: np.ndarray, slack: int) -> list[IndexEntry]:
        """Entries a trimmable entry holding ``tokens`` serves as well, give or take their
        last ``slack`` tokens: its prefixes, and the earlier turns of its conversation
        (whose generated tail the next turn's re-rendered prompt does not repeat)."""
        with self._lock:
            entries = list(self._by_ns.get(ns, {}).values())
        return [e for e in entries
                if e.n <= tokens.size and not np.array_equal(e.tokens, tokens)
                and common_prefix(e.tokens, tokens) >= e.n - min(slack, e.n // 8)]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_ns.values())

    def entries(self) -> Iterator[IndexEntry]:
        with self._lock:
            items = [e for v in self._by_ns.values() for e in v.values()]
        return iter(items)

    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries())

    def longest(self) -> int:
        return max((e.n for e in self.entries()), default=0)

    # -- changes ---------------------------------------------------------------------
    def add(self, entry: IndexEntry) -> None:
        with self._lock:
            self._by_ns.setdefault(entry.ns, {})[entry.path] = entry

    def remove(self, path: Path, *, delete: bool = True) -> None:
        ns = path.parent.name
        with self._lock:
            self._by_ns.get(ns, {}).pop(path, None)
        if delete:
            maybe_remove(path)

    def touch(self, entry: IndexEntry, now: float) -> None:
        entry.used = now
        with contextlib.suppress(OSError):
            os.utime(entry.path, (now, now))

    def disk_files(self) -> list[tuple[float, int, Path]]:
        """Every entry file under the root (all fingerprints): (mtime, size, path)."""
        out: list[tuple[float, int, Path]] = []
        try:
            fps = [d for d in os.scandir(self.root) if d.is_dir(follow_symlinks=False)]
        except OSError:
            return out
        for fp in fps:
            try:
                nss = [d for d in os.scandir(fp.path) if d.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for ns in nss:
                try:
                    for f in os.scandir(ns.path):
                        if f.name.endswith(SUFFIX) and not f.name.startswith("."):
                            st = f.stat(follow_symlinks=False)
                            out.append((st.st_mtime, st.st_size, Path(f.path)))
                except OSError:
                    continue
        return out
