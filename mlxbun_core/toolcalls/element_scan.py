"""The incremental form shared by element dialects (Qwen3.5's ``<function=…>
<parameter=…>``, GLM's ``<arg_key>/<arg_value>``, MiniCPM5's ``<param name=…>``): a head
that names the function, then one element per argument whose raw value streams as it
is written. A family describes its markup with patterns; a value that is not plain
raw text (MiniCPM5's CDATA) overrides :meth:`ElementScanner.reader`."""

from __future__ import annotations

import re
from collections.abc import Callable

from .incremental import WAIT, CallSink, RawValue, Scanner

PATIENCE = 200  # characters a head or key may take to complete before the scan gives up


def _same(s: str) -> str:
    return s.strip()


class ElementScanner(Scanner):
    """``head`` matches at the block's start (group 1: the name); ``key`` matches an
    argument's opening (group 1: its key) after blanks, literally starting with
    ``key_lit``; the value runs to ``value_close``, trimmed as :class:`RawValue`'s
    ``trim`` says; ``call_end`` (if any) closes the call. ``clean`` tidies a name or key
    as the family's whole parse does."""

    def __init__(self, head: re.Pattern[str], key: re.Pattern[str], key_lit: str,
                 value_close: str, trim: str = "raw", call_end: str | None = None,
                 clean: Callable[[str], str] = _same):
        super().__init__()
        self.head, self.key, self.key_lit = head, key, key_lit
        self.value_close, self.trim, self.call_end, self.clean = value_close, trim, call_end, clean
        self.value: RawValue | None = None

    def reader(self, text: str, start: int) -> RawValue | None:
        """How the value starting at ``start`` reads (WAIT: not known yet)."""
        return RawValue(start, self.value_close, self.trim, guard=self.call_end)

    def step(self, text: str, sink: CallSink) -> bool | None:
        if self.pos == 0:
            m = self.head.match(text)
            if m is None:
                return WAIT if len(text) < PATIENCE else self.stop()
            if not sink.begin(self.clean(m.group(1))):
                return self.stop()
            self.pos = m.end()
            return True
        if self.value is not None:
            return self._read(text, sink)
        i = self.pos
        while i < len(text) and text[i].isspace():
            i += 1
        rest = text[i:]
        m = self.key.match(text, i)
        if m is None:
            if self.call_end and rest.startswith(self.call_end):
                return self.stop()
            maybe = self.key_lit.startswith(rest) or rest.startswith(self.key_lit) \
                or bool(self.call_end and self.call_end.startswith(rest))
            return WAIT if maybe and len(rest) < PATIENCE else self.stop()
        reader = self.reader(text, m.end())
        if reader is None:
            return WAIT
        sink.text_begin(self.clean(m.group(1)))
        self.value, self.pos = reader, m.end()
        return True

    def _read(self, text: str, sink: CallSink) -> bool | None:
        assert self.value is not None
        end = self.value.read(text, sink)
        if end is None:
            return WAIT
        if end < 0:
            return self.stop()
        after = self.after_value(text, end)
        if after is None:
            return WAIT
        if after < 0:
            return self.stop()
        sink.text_end()
        self.value, self.pos = None, after
        return True

    def after_value(self, text: str, end: int) -> int | None:
        """Where the next argument may start, once a value's close is at ``end``
        (WAIT: not sure yet; -1: the value goes on in a way this scan does not follow)."""
        return end
