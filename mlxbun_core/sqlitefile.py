"""One SQLite file, opened for one piece of work: the way the memory vault's revisions and
search index and the job store each use theirs (a connection per call, so the server's
threads and a CLI process share the file, and nothing stays open between calls)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def opened(path: Path, *, timeout: float = 10.0, pragmas: Sequence[str] = (),
           prepare: Callable[[sqlite3.Connection], None] | None = None, schema: str = "",
           autocommit: bool = False, rows: bool = False) -> Iterator[sqlite3.Connection]:
    """``path`` connected (its folder made), then ``prepare(db)``, the ``pragmas`` and the
    ``schema`` (``CREATE ... IF NOT EXISTS``) run. The block is one transaction, committed
    when it ends without an error (``autocommit``: every statement commits on its own);
    ``rows``: rows as :class:`sqlite3.Row`. The connection is closed either way
    (``sqlite3``'s own context manager only commits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=timeout,
                         isolation_level=None if autocommit else "DEFERRED")
    try:
        if rows:
            db.row_factory = sqlite3.Row
        if prepare is not None:
            prepare(db)
        for pragma in pragmas:
            db.execute(f"PRAGMA {pragma}")
        if schema:
            db.executescript(schema)
        if autocommit:
            yield db
        else:
            with db:
                yield db
    finally:
        db.close()
