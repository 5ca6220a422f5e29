"""The incremental form of the Hermes dialect: ``<tool_call>{"name": "f", "arguments":
{…}}</tool_call>`` read as it is written. The name streams once its string closes;
each argument of the ``arguments`` object as it comes (a string character by character,
escapes decoded whole, any other value once it ends). Anything else (``arguments``
before ``name``, arguments as a JSON string, a list of calls, near-JSON the repair
would fix) stops the scan, and the block's whole parse finishes the call."""

from __future__ import annotations

import json
from typing import Any

from .incremental import WAIT, CallSink, Scanner

_WS = " \t\r\n"
_ARGS = ("arguments", "parameters")


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def string_end(text: str, i: int) -> tuple[int, bool]:
    """From inside a JSON string at ``i``: ``(offset, closed)``: the offset of its
    closing quote (closed), or how far it can be decoded now (an escape, or a
    surrogate pair's first half, is never split)."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return i, True
        if c != "\\":
            i += 1
            continue
        if i + 1 >= n:
            break
        if text[i + 1] != "u":
            i += 2
            continue
        if i + 6 > n:
            break
        try:
            code = int(text[i + 2:i + 6], 16)
        except ValueError:
            i += 2  # not a \\u escape: the decode decides
            continue
        if 0xD800 <= code < 0xDC00:
            if i + 6 == n or (text[i + 6] == "\\" and i + 12 > n):
                break
            if text[i + 6] == "\\":
                i += 12
                continue
        i += 6
    return i, False


def _decode(raw: str) -> str | None:
    try:
        out = json.loads('"' + raw + '"', strict=False)
    except ValueError:
        return None
    return out if isinstance(out, str) else None


def value_end(text: str, i: int) -> int | None:
    """The end of the JSON value (not a string) starting at ``i``: the offset of the
    ``,`` or ``}`` that follows it at depth 0, or None (not there yet)."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            e, closed = string_end(text, i + 1)
            if not closed:
                return None
            i = e + 1
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            if depth == 0:
                return i
            depth -= 1
        elif c == "," and depth == 0:
            return i
        i += 1
    return None


class JsonScanner(Scanner):
    """See the module docstring. States: ``envelope`` (before a member's key),
    ``args`` (before an argument's key, or its end), ``text`` (inside a string
    argument, ``self.key``), ``after_text`` (after one)."""

    def __init__(self, start: str = "<tool_call>"):
        super().__init__()
        self.start = start
        self.state = "open"
        self.name: str | None = None
        self.key = ""
        self.sent = 0  # string state: raw offset streamed up to

    def _string(self, text: str, i: int) -> tuple[str, int] | None:
        """A whole JSON string at ``i`` (its opening quote): (value, offset past it)."""
        if i >= len(text) or text[i] != '"':
            return None
        e, closed = string_end(text, i + 1)
        if not closed:
            return None
        s = _decode(text[i + 1:e])
        return None if s is None else (s, e + 1)

    def _member(self, text: str) -> tuple[str, int] | None | bool:
        """``"key":`` at the current place: (key, offset of its value), WAIT, or False."""
        i = _skip_ws(text, self.pos)
        if i >= len(text):
            return WAIT
        if text[i] != '"':
            return False
        got = self._string(text, i)
        if got is None:
            return WAIT if not string_end(text, i + 1)[1] else False
        key, j = got
        j = _skip_ws(text, j)
        if j >= len(text):
            return WAIT
        if text[j] != ":":
            return False
        j = _skip_ws(text, j + 1)
        return WAIT if j >= len(text) else (key, j)

    def step(self, text: str, sink: CallSink) -> bool | None:
        return getattr(self, "_" + self.state)(text, sink)

    def _open(self, text: str, sink: CallSink) -> bool | None:
        if not text.startswith(self.start):
            return self.stop()
        i = _skip_ws(text, len(self.start))
        if i >= len(text):
            return WAIT
        if text[i] != "{":
            return self.stop()
        self.pos, self.state = i + 1, "envelope"
        return True

    def _envelope(self, text: str, sink: CallSink) -> bool | None:
        got = self._member(text)
        if not isinstance(got, tuple):
            return got if got is WAIT else self.stop()
        key, j = got
        if key == "name":
            name = self._string(text, j)
            if name is None:
                return WAIT if not string_end(text, j + 1)[1] and text[j] == '"' \
                    else self.stop()
            self.name, end = name[0].strip(), name[1]
            k = _skip_ws(text, end)
            if k >= len(text):
                return WAIT
            if text[k] != "," or not sink.begin(self.name):
                return self.stop()
            self.pos = k + 1
            return True
        if key in _ARGS and self.name is not None and text[j] == "{":
            self.pos, self.state = j + 1, "args"
            return True
        return self.stop()

    def _args(self, text: str, sink: CallSink) -> bool | None:
        i = _skip_ws(text, self.pos)
        if i < len(text) and text[i] == "}":
            return self.stop()  # every argument is in; the close writes the rest
        got = self._member(text)
        if not isinstance(got, tuple):
            return got if got is WAIT else self.stop()
        self.key, j = got
        if text[j] == '"':
            sink.text_begin(self.key)
            self.pos, self.sent, self.state = j + 1, j + 1, "text"
            return True
        e = value_end(text, j)
        if e is None:
            return WAIT
        try:
            value: Any = json.loads(text[j:e])
        except ValueError:
            return self.stop()
        sink.value(self.key, value)
        return self._after(text, e)

    def _after(self, text: str, e: int) -> bool:
        """After a value: ``,`` leads to the next argument, ``}`` ends them."""
        if text[e] == "}":
            return self.stop()
        self.pos, self.state = e + 1, "args"
        return True

    def _text(self, text: str, sink: CallSink) -> bool | None:
        e, closed = string_end(text, self.sent)
        if e > self.sent:
            more = _decode(text[self.sent:e])
            if more is None:
                return self.stop()
            sink.text(more)
            self.sent = e
        if not closed:
            return WAIT
        sink.text_end()
        k = _skip_ws(text, e + 1)
        if k >= len(text):
            self.pos, self.state = e + 1, "after_text"
            return WAIT
        return self._after(text, k) if text[k] in ",}" else self.stop()

    def _after_text(self, text: str, sink: CallSink) -> bool | None:
        k = _skip_ws(text, self.pos)
        if k >= len(text):
            return WAIT
        return self._after(text, k) if text[k] in ",}" else self.stop()
