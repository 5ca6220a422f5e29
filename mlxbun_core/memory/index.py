"""The vault's search index: one SQLite FTS5 row per non-empty line of every document.

A row knows its document (an article stem or ``Reference/<id>``), the anchor of the
section it sits in and its line number, so a hit can point into the article. The index is
derived data: it is rebuilt from the files whenever it is missing or suspect. Its file has
a hard byte cap (SQLite's ``max_page_count``): past it, indexing stops with the rows it
has and the search says the index is incomplete, instead of the disk filling up.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path

from ..sqlitefile import opened
from .articles import anchor_of, excerpt

DEFAULT_MAX_BYTES = 128 << 20
MAX_TERMS = 16
SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS lines USING fts5(
  doc UNINDEXED, scope UNINDEXED, anchor UNINDEXED, line UNINDEXED, text,
  tokenize = 'porter unicode61');
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, doc TEXT UNIQUE NOT NULL);
"""
LINE_BITS = 20  # a row's rowid is (document id << 20) | line: a document's rows are one range


def query_terms(query: str) -> list[str]:
    """The words of a query (letters and digits), lower case, each once, at most 16: the
    only thing of the query that reaches FTS5, each as a quoted phrase."""
    words = dict.fromkeys(w.lower() for w in re.findall(r"\w+", query))
    return list(words)[:MAX_TERMS]


def _doc_id(db: sqlite3.Connection, doc: str) -> int:
    db.execute("INSERT OR IGNORE INTO docs(doc) VALUES (?)", (doc,))
    return int(db.execute("SELECT id FROM docs WHERE doc=?", (doc,)).fetchone()[0])


def _rows(base: int, doc: str, scope: str, text: str) -> list[tuple]:
    """One row per non-empty line (at most 2**20 of them), with the anchor of its section."""
    rows, anchor = [], ""
    for n, line in enumerate(text.splitlines()[:(1 << LINE_BITS) - 1], 1):
        if line.startswith("#"):
            anchor = anchor_of(line.lstrip("#"))
        if line.strip():
            rows.append((base + n, doc, scope, anchor, n, line))
    return rows


class SearchIndex:
    """The FTS5 file of one vault."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.path, self.max_bytes = Path(path), max_bytes

    def _db(self) -> AbstractContextManager[sqlite3.Connection]:
        # derived data, so no sync: a crash means a reindex
        return opened(self.path, prepare=self._cap, pragmas=("synchronous = OFF",),
                      schema=SCHEMA)

    def _cap(self, db: sqlite3.Connection) -> None:
        """The byte cap, in pages of this file."""
        page = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {max(16, self.max_bytes // page)}")

    def put(self, doc: str, scope: str, text: str) -> bool:
        """(Re)index one document; False when the byte cap stopped it part way."""
        return self.put_many([(doc, scope, text)])

    def put_many(self, docs: Iterable[tuple[str, str, str]], clear: bool = False) -> bool:
        """(Re)index ``(doc, scope, text)`` documents in one transaction (``clear``: after
        dropping every row); False when the byte cap stopped it (nothing is written then)."""
        try:
            with self._db() as db:
                if clear:
                    for table in ("lines", "meta", "docs"):
                        db.execute(f"DELETE FROM {table}")
                for doc, scope, text in docs:
                    base = _doc_id(db, doc) << LINE_BITS
                    if not clear:
                        db.execute("DELETE FROM lines WHERE rowid BETWEEN ? AND ?",
                                   (base, base + (1 << LINE_BITS) - 1))
                    db.executemany("INSERT INTO lines(rowid, doc, scope, anchor, line, text) "
                                   "VALUES (?,?,?,?,?,?)", _rows(base, doc, scope, text))
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc):
                raise
            self._set("incomplete", "1")
            return False
        return True

    def _set(self, key: str, value: str) -> None:
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)", (key, value))

    def incomplete(self) -> bool:
        with self._db() as db:
            return db.execute("SELECT 1 FROM meta WHERE key='incomplete'").fetchone() is not None

    def search(self, query: str, scope: str = "all", limit: int = 50) -> dict:
        """Ranked documents (``summaries``) and the matching lines (``hits``) for ``query``:
        a line matches when it holds any of the query's words (stemmed)."""
        terms = query_terms(query)
        if not terms:
            return {"summaries": [], "hits": []}
        match = " OR ".join('"' + t.replace('"', "") + '"' for t in terms)
        where = "" if scope == "all" else " AND scope = ?"
        args: tuple = (match, scope) if scope != "all" else (match,)
        with self._db() as db:
            rows = db.execute(f"SELECT doc, anchor, line, text FROM lines WHERE lines MATCH ?"
                              f"{where} ORDER BY rank LIMIT 2000", args).fetchall()
        docs: dict[str, dict] = {}
        for doc, _anchor, _line, text in rows:
            low = text.lower()
            d = docs.setdefault(doc, {"article": doc, "occurrences": 0, "matched_terms": []})
            d["occurrences"] += 1
            d["matched_terms"] += [t for t in terms if t in low and t not in d["matched_terms"]]
        summaries = sorted(docs.values(), key=lambda d: (-len(d["matched_terms"]),
                                                         -d["occurrences"], d["article"]))[:limit]
        order = {d["article"]: i for i, d in enumerate(summaries)}
        hits = [{"article": doc, "anchor": anchor, "line": line, "excerpt": excerpt(text)}
                for doc, anchor, line, text in rows if doc in order]
        hits.sort(key=lambda h: (order[h["article"]], h["line"]))
        return {"summaries": summaries, "hits": hits[:limit]}
