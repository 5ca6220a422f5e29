"""Text the approval card shows, made unable to lie about what it shows.

A file name may hold a newline (``harmless.txt\\n+++ b/harmless.txt`` wrote a fake diff
header onto the card), a carriage return, terminal escapes or bidirectional overrides that
reorder what the user reads. Names are quoted the way git quotes them (``"a/x\\ny"``: C
escapes inside double quotes) when they hold any control or format character, a quote or
a backslash; other text (a diff's lines, a command) keeps its newlines and tabs and has
every other control character, line separator and bidirectional control escaped.
"""

from __future__ import annotations

import unicodedata

_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 \
        else f"\\U{code:08x}"


def _unsafe_in_name(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") or ch in '"\\'


def _unsafe_in_text(ch: str) -> bool:
    category = unicodedata.category(ch)
    return (category == "Cc" and ch not in "\n\t") or category in ("Zl", "Zp") or ch in _BIDI


def name(text: str) -> str:
    """A path for the card: as it is, or git-quoted when any character could mislead."""
    if not any(_unsafe_in_name(ch) for ch in text):
        return text
    return '"' + "".join(_escape(ch) if _unsafe_in_name(ch) else ch for ch in text) + '"'


def text(value: str) -> str:
    """Text for the card: newlines and tabs kept, other controls escaped."""
    if not any(_unsafe_in_text(ch) for ch in value):
        return value
    return "".join(_escape(ch) if _unsafe_in_text(ch) else ch for ch in value)


def line(value: str) -> str:
    """One line for the card: like :func:`text`, with a newline escaped too."""
    return text(value).replace("\n", "\\n")
