"""The accept error a full file table causes, said once per :data:`NOTE_EVERY_S` rather than
thousands of times a second (with a traceback each)."""

from __future__ import annotations

import logging
import time

from ..fdlimit import open_file_limit

NOTE_EVERY_S = 10.0


class AcceptErrorFilter(logging.Filter):
    """asyncio logs ``socket.accept() out of system resource`` (with a traceback) for
    every failed accept, thousands a second once the file table is full: one line per
    ``every`` seconds passes, saying how many were held back."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, every: float = NOTE_EVERY_S):
        super().__init__()
        self.every, self.last, self.held = every, -every, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.MESSAGE):
            return True
        now = time.monotonic()
        if now - self.last < self.every:
            self.held += 1
            return False
        exc = record.exc_info[1] if record.exc_info else None
        held = f"; {self.held} more in the last {now - self.last:.0f} s" if self.held else ""
        record.msg = (f"{self.MESSAGE}: {exc or 'unknown error'} (open-file limit "
                      f"{open_file_limit()}{held}; one line per {self.every:g} s)")
        record.args, record.exc_info, record.exc_text = (), None, None
        self.last, self.held = now, 0
        return True


def install_accept_error_filter() -> None:
    """Once per process, on the ``asyncio`` logger."""
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, AcceptErrorFilter) for f in logger.filters):
        logger.addFilter(AcceptErrorFilter())
