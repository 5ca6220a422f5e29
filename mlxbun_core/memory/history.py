"""Every revision of every article, in one SQLite file, so a change can be read and diffed.

A revision is the article's whole text after a write, under a 40-hex id (a SHA-1 of the
article, the text and the previous id), with a one-line subject saying what wrote it. The
diff of a revision is against the article's revision before it (none: against nothing,
as for a new file). The file has a byte cap: past it the oldest revisions that are not an
article's latest are dropped. The same file records which conversations synthesis has
read (``sources``), so a second run skips what has not changed.
"""

from __future__ import annotations

import difflib
import hashlib
import sqlite3
import time
from contextlib import AbstractContextManager
from pathlib import Path

from ..sqlitefile import opened

DEFAULT_MAX_BYTES = 64 << 20
SCHEMA = """
CREATE TABLE IF NOT EXISTS revisions (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, rev TEXT UNIQUE NOT NULL, article TEXT NOT NULL,
  ts REAL NOT NULL, subject TEXT NOT NULL, content TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS revisions_article ON revisions(article, seq);
CREATE TABLE IF NOT EXISTS sources (id TEXT PRIMARY KEY, digest TEXT NOT NULL, ts REAL NOT NULL);
"""


class History:
    """The revisions file of one vault."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.path, self.max_bytes = Path(path), max_bytes

    def _db(self) -> AbstractContextManager[sqlite3.Connection]:
        # WAL: readers never wait for a synthesis
        return opened(self.path, pragmas=("journal_mode = WAL", "synchronous = NORMAL"),
                      schema=SCHEMA)

    def record(self, article: str, content: str, subject: str) -> str | None:
        """Save ``content`` as the article's newest revision; its id (None: unchanged)."""
        with self._db() as db:
            prev = db.execute("SELECT rev, content FROM revisions WHERE article=? "
                              "ORDER BY seq DESC LIMIT 1", (article,)).fetchone()
            if prev is not None and prev[1] == content:
                return None
            seed = "\0".join((article, prev[0] if prev else "", content, str(time.time_ns())))
            rev = hashlib.sha1(seed.encode()).hexdigest()
            db.execute("INSERT INTO revisions(rev, article, ts, subject, content) "
                       "VALUES (?,?,?,?,?)", (rev, article, time.time(), subject[:200], content))
            self._trim(db)
        return rev

    def _trim(self, db: sqlite3.Connection) -> None:
        """Drop the oldest superseded revisions while the stored text is over the cap."""
        total = db.execute("SELECT COALESCE(SUM(LENGTH(CAST(content AS BLOB))), 0) "
                           "FROM revisions").fetchone()[0]
        if total <= self.max_bytes:
            return
        rows = db.execute("SELECT seq, LENGTH(CAST(content AS BLOB)) FROM revisions r WHERE "
                          "seq < (SELECT MAX(seq) FROM revisions WHERE article=r.article) "
                          "ORDER BY seq").fetchall()
        drop = []
        for seq, size in rows:
            if total <= self.max_bytes:
                break
            drop.append((seq,))
            total -= size
        db.executemany("DELETE FROM revisions WHERE seq=?", drop)

    def log(self, article: str, limit: int) -> list[dict]:
        """Newest first: ``{hash, date, subject}``."""
        with self._db() as db:
            rows = db.execute("SELECT rev, ts, subject FROM revisions WHERE article=? "
                              "ORDER BY seq DESC LIMIT ?", (article, limit)).fetchall()
        return [{"hash": rev, "date": time.strftime("%Y-%m-%d", time.localtime(ts)),
                 "subject": subject} for rev, ts, subject in rows]

    def diff(self, article: str, rev: str, path: str) -> str | None:
        """The unified diff revision ``rev`` (a full id or a unique prefix of one) made to
        ``article`` (shown as ``path``); None when there is no such revision of it."""
        with self._db() as db:
            rows = db.execute("SELECT seq, content FROM revisions WHERE article=? AND rev LIKE ? "
                              "LIMIT 2", (article, rev + "%")).fetchall()
            if len(rows) != 1:
                return None
            seq, new = rows[0]
            before = db.execute("SELECT content FROM revisions WHERE article=? AND seq<? "
                                "ORDER BY seq DESC LIMIT 1", (article, seq)).fetchone()
        old = before[0] if before else ""
        body = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                    "/dev/null" if before is None else f"a/{path}", f"b/{path}")
        text = "".join(line if line.endswith("\n") else line + "\n" for line in body)
        return f"diff --git a/{path} b/{path}\n{text}" if text else None

    def source_digest(self, source_id: str) -> str | None:
        with self._db() as db:
            row = db.execute("SELECT digest FROM sources WHERE id=?", (source_id,)).fetchone()
        return row[0] if row else None

    def mark_source(self, source_id: str, digest: str) -> None:
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO sources(id, digest, ts) VALUES (?,?,?)",
                       (source_id, digest, time.time()))

    def sources_read(self) -> tuple[int, float | None]:
        """How many conversations synthesis has read, and when it last marked one (None:
        never): what the Memory panel shows as coverage and the last run."""
        if not self.path.exists():
            return 0, None
        with self._db() as db:
            count, last = db.execute("SELECT COUNT(*), MAX(ts) FROM sources").fetchone()
        return int(count), last
