"""Tool calls as they are written: a dialect's :class:`Scanner` reads one markup block
as it grows and tells a :class:`CallSink` the call's name and its arguments; a
:class:`StreamedCall` turns those into the exact JSON text the finished call carries.

The arguments stream as canonical JSON (``json.dumps(args, ensure_ascii=False)``, the
text :func:`~mlxbun_core.toolcalls.make_call` writes): ``{``, then each argument once
its value is known (a string argument character by character, other values whole,
decoded against the tool's schema), then ``}`` when the block closes. A scanner only
reports what is sure; on anything it does not follow it stops, and the block's whole
parse supplies the rest when it closes (:meth:`StreamedCall.close`). So the pieces,
joined, always equal the finished call's ``arguments``. Once an argument has streamed
it stands: a later repeat of its key is ignored (the first value wins)."""

from __future__ import annotations

import json
from typing import Any

from ..events import ToolCallDelta
from ..holdback import held_marker_prefix
from .core import arg_types, coerce_value, new_call_id, tool_params

WAIT = None  # a scanner step needs more text


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


class StreamedCall:
    """One call's arguments as streamed JSON text (see the module docstring)."""

    def __init__(self, name: str, tools: list | None):
        self.id, self.name = new_call_id(), name
        self.params = tool_params(tools, name)
        self.parts: list[str] = ["{"]
        self.keys: dict[str, Any] = {}  # arguments streamed, with their values
        self.open_key: str | None = None  # a string argument being written
        self.open_stream = False  # ... whose text streams (the schema says string)
        self.open_text: list[str] = []
        self.skip = False  # the open argument repeats a key: ignored

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _put(self, s: str, out: list[str]) -> None:
        self.parts.append(s)
        out.append(s)

    def _key_head(self, key: str) -> str:
        return (", " if self.keys else "") + _dumps(key) + ": "

    def value(self, key: str, value: Any, out: list[str]) -> None:
        """A whole argument value (raw text, or decoded JSON), coerced as make_call does."""
        if key in self.keys:
            return
        v = coerce_value(value, arg_types(self.params, key))
        self._put(self._key_head(key) + _dumps(v), out)
        self.keys[key] = v

    def text_begin(self, key: str, out: list[str]) -> None:
        self.open_key, self.open_text, self.skip = key, [], key in self.keys
        self.open_stream = not self.skip and "string" in arg_types(self.params, key)
        if self.open_stream:
            self._put(self._key_head(key) + '"', out)

    def text_more(self, s: str, out: list[str]) -> None:
        if self.open_key is None or not s:
            return
        self.open_text.append(s)
        if self.open_stream:
            self._put(_dumps(s)[1:-1], out)

    def text_end(self, out: list[str]) -> None:
        key, raw = self.open_key, "".join(self.open_text)
        self.open_key = None
        if key is None or self.skip:
            return
        if self.open_stream:
            self._put('"', out)
            self.keys[key] = raw
        else:
            self.value(key, raw, out)

    def close(self, final: dict[str, Any]) -> str:
        """The rest of the text, from the whole parse's arguments ``final``: an open
        string argument finished, the arguments not streamed yet, ``}``."""
        out: list[str] = []
        if self.open_key is not None and self.open_stream:
            key, sent = self.open_key, "".join(self.open_text)
            v = final.get(key)
            rest = v[len(sent):] if isinstance(v, str) and v.startswith(sent) else ""
            self._put(_dumps(rest)[1:-1] + '"', out)
            self.keys[key] = sent + rest
        self.open_key = None
        for k, v in final.items():
            if k not in self.keys:
                self._put(self._key_head(k) + _dumps(v), out)
                self.keys[k] = v
        self._put("}", out)
        return "".join(out)


class CallSink:
    """What a scanner reports to: the one call a block streams (later calls in the same
    block, and a call ``allow`` refuses, are left to the whole parse)."""

    def __init__(self, tools: list | None, allow: bool = True):
        self.tools, self.allow = tools, allow
        self.call: StreamedCall | None = None
        self.events: list[Any] = []
        self._out: list[str] = []

    def begin(self, name: str) -> bool:
        """A call's name is known; False: do not stream it (scan no further)."""
        from ..events import ToolCallStart

        if self.call is not None or not self.allow or not name:
            return False
        self.call = StreamedCall(name, self.tools)
        self.events.append(ToolCallStart(self.call.id, name))
        self._out.append("{")
        return True

    def value(self, key: str, value: Any) -> None:
        if self.call is not None:
            self.call.value(key, value, self._out)

    def text_begin(self, key: str) -> None:
        if self.call is not None:
            self.call.text_begin(key, self._out)

    def text(self, s: str) -> None:
        if self.call is not None:
            self.call.text_more(s, self._out)

    def text_end(self) -> None:
        if self.call is not None:
            self.call.text_end(self._out)

    def drain(self) -> list[Any]:
        """The events since the last drain: the start, then one delta of new text."""
        ev, self.events = self.events, []
        if self._out and self.call is not None:
            ev.append(ToolCallDelta(self.call.id, "".join(self._out)))
        self._out = []
        return ev


class Scanner:
    """Reads one markup block as it grows and reports the call to a :class:`CallSink`.

    ``scan`` gets the whole block so far each time (start marker included, the end
    marker and any possible start of it left out) and keeps its own place. Subclasses
    implement ``step(text, sink)``: advance ``self.pos`` and return True, return
    :data:`WAIT` for more text, or call :meth:`stop`."""

    def __init__(self) -> None:
        self.pos = 0
        self.stopped = False

    def stop(self) -> bool:
        self.stopped = True
        return False

    def scan(self, text: str, sink: CallSink) -> None:
        while not self.stopped and self.step(text, sink):
            pass

    def step(self, text: str, sink: CallSink) -> bool | None:
        raise NotImplementedError


class RawValue:
    """One raw argument value streamed up to the literal ``close``. ``trim``: ``"raw"``
    as written, ``"unframe"`` one framing newline dropped at each end (Qwen),
    ``"strip"`` blanks dropped at both ends (MiniCPM5's plain values). ``guard``: markup
    that must not come before ``close`` (Qwen's ``</function>``: a value whose
    ``</parameter>`` is missing); held back like ``close``, and if it comes the read
    stops there (-1) and the whole parse decides the value."""

    def __init__(self, start: int, close: str, trim: str = "raw", guard: str | None = None):
        self.start, self.close, self.trim, self.guard = start, close, trim, guard
        self.lead: int | None = None  # characters dropped at the front
        self.sent = 0  # characters streamed after them
        self.end: int | None = None  # the offset past ``close``, once read

    def read(self, text: str, sink: CallSink) -> int | None:
        """Stream what is sure; once ``close`` comes, the rest of the value and the
        offset just past ``close`` (again on a later read: the value is done)."""
        if self.end is not None:
            return self.end
        first = self.start + (self.lead or 0) + self.sent
        i = text.find(self.close, first)
        if self.guard is not None and 0 <= text.find(self.guard, first) < \
                (i if i >= 0 else len(text)):
            return -1
        if i >= 0:
            final = _trimmed(text[self.start:i], self.trim)
            sink.text(final[self.sent:])
            self.end = i + len(self.close)
            return self.end
        marks = (self.close,) if self.guard is None else (self.close, self.guard)
        end = len(text) - held_marker_prefix(text[self.start:], marks)
        if self.lead is None:
            self.lead = _lead(text[self.start:end], self.trim)
            if self.lead is None:
                return WAIT
        first = self.start + self.lead + self.sent
        stop = end - _tail_hold(text[first:end], self.trim)
        if stop > first:
            sink.text(text[first:stop])
            self.sent += stop - first
        return WAIT


def _lead(body: str, trim: str) -> int | None:
    if trim == "unframe":
        if body.startswith("\r\n"):
            return 2
        if body.startswith("\n"):
            return 1
        return WAIT if body in ("", "\r") else 0
    if trim == "strip":
        n = len(body) - len(body.lstrip())
        return WAIT if n == len(body) else n
    return 0


def _trimmed(raw: str, trim: str) -> str:
    if trim == "strip":
        return raw.strip()
    if trim == "unframe":
        raw = raw[2:] if raw.startswith("\r\n") else raw[1:] if raw.startswith("\n") else raw
        return raw[:-2] if raw.endswith("\r\n") else raw[:-1] if raw.endswith("\n") else raw
    return raw


def _tail_hold(body: str, trim: str) -> int:
    if trim == "strip":
        return len(body) - len(body.rstrip())
    if trim == "unframe":
        if body.endswith("\r\n"):
            return 2
        return 1 if body.endswith(("\n", "\r")) else 0
    return 0
