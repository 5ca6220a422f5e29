"""Full-text search over session message bodies: a plain scan, sized for one person's chats.

Matches carry a plain-text snippet and ``[start, end)`` offsets into it, never HTML:
the page escapes the snippet and adds its own highlight.
"""

from __future__ import annotations

import re

from .store import (
    SessionStore,
    iter_message_entries,
    message_text,
    read_entries,
    replayed_messages,
    session_title,
)

MAX_RESULTS = 50
MAX_PER_SESSION = 10
CONTEXT_CHARS = 60


def snippet(text: str, start: int, end: int, pattern: re.Pattern) -> dict:
    """``text`` around ``[start, end)`` (±60 chars), with every match inside it as ranges."""
    lo, hi = max(0, start - CONTEXT_CHARS), min(len(text), end + CONTEXT_CHARS)
    window = text[lo:hi]
    return {"snippet": window, "ranges": [[m.start(), m.end()] for m in pattern.finditer(window)]}


def search(store: SessionStore, query: str, *, limit: int = MAX_RESULTS,
           per_session: int = MAX_PER_SESSION) -> list:
    """Case-insensitive substring matches in user and assistant messages, newest sessions first."""
    pattern = re.compile(re.escape(query), re.IGNORECASE)
    results, total = [], 0
    for path in store.files():
        if total >= limit:
            break
        matches: list[dict] = []
        for entry in iter_message_entries(path):
            msg = entry["message"]
            if msg.get("role") not in ("user", "assistant"):
                continue
            text, last_end = message_text(msg), -1
            for m in pattern.finditer(text):
                if len(matches) >= per_session or total + len(matches) >= limit:
                    break
                if m.start() < last_end:
                    continue  # already inside the previous snippet
                matches.append({**snippet(text, m.start(), m.end(), pattern),
                                "role": msg["role"], "entryId": entry["id"]})
                last_end = m.end() + CONTEXT_CHARS
        if matches:
            entries = read_entries(path)
            head: dict = next((e for e in entries if e["type"] == "session"), {})
            title = session_title(head, replayed_messages(entries))
            results.append({"sessionPath": str(path), "sessionTitle": title, "matches": matches})
            total += len(matches)
    return results
