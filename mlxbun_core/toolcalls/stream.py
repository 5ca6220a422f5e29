"""The streaming splitter: live content, withheld tool markup, parsed calls.

Chunking-independent by construction: markup starts/ends are found by plain
substring search over the accumulated buffer, and keepalives fire on absolute
multiples of ``KEEPALIVE_EVERY`` buffered markup chars, so char-by-char and any
other chunking give the same events once adjacent content events are merged.

A call is held back until its markup closes, unless the dialect has an incremental
form (:meth:`Dialect.scanner`): then the call's name and arguments stream as they are
written (``ToolCallStart``, ``ToolCallDelta``; :mod:`.incremental`) and the close
finishes them from the block's whole parse, so the finished call is the same either
way. A streamed call that does not end as a call is withdrawn (``ToolCallWithdrawn``).
Markup still open when the reply ends is never a call made
of what was there: cut by the budget or a stop sequence it is dropped (and so is a
held prefix of a start marker); ended by the model's own EOS it is a call only when
the dialect says the block is whole (:meth:`Dialect.whole_at_eos`), and dropped
otherwise. Markup that never closed is never shown as text."""

from __future__ import annotations

import copy
import json

from ..events import (
    KEEPALIVE,
    Content,
    ParserEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallEvent,
    ToolCallWithdrawn,
)
from ..holdback import held_marker_prefix
from .incremental import CallSink, Scanner, StreamedCall

Event = ParserEvent  # Content | ToolCallEvent | KeepAlive
KEEPALIVE_EVERY = 256


class Dialect:
    """A tool-call markup syntax.

    ``starts`` open a markup block; by default a block ends at the first ``end_for(start)``
    after its start (``end`` None = runs to EOS). ``parse`` returns the calls in one
    block (markers included, end marker possibly missing when truncated), or None
    when unparseable so the block falls back to plain content."""

    starts: tuple[str, ...] = ()
    end: str | None = None

    def call_grammar(self, tools: list) -> dict | None:
        """The grammar of one call of any of ``tools`` in this dialect's markup, its
        arguments following each tool's JSON schema: a structural ``tag`` whose
        ``begin`` is one of ``starts`` (see :mod:`mlxbun_core.grammar.structural`
        and the helpers in :mod:`mlxbun_core.toolcalls.grammar`). None: this dialect
        cannot say (a forced tool choice is then asked for in words)."""
        return None

    def end_for(self, start: str) -> str | None:
        return self.end

    def scanner(self) -> Scanner | None:
        """A fresh incremental reader for one block, so its call streams as it is
        written (:mod:`mlxbun_core.toolcalls.incremental`); None (the default): the
        call is emitted whole once its block closes."""
        return None

    def body_so_far(self, markup: str, closed: bool) -> str:
        """``markup`` without its end marker (closed) or a possible start of one."""
        start = next((s for s in sorted(self.starts, key=len, reverse=True)
                      if markup.startswith(s)), "")
        e = self.end_for(start) if start else None
        if not e:
            return markup
        if closed:
            return markup[:-len(e)] if markup.endswith(e) else markup
        return markup[:len(markup) - held_marker_prefix(markup, (e,))]

    def complete(self, buffer: str, since: int = 0) -> int | None:
        """Offset just past the end of the block at the head of ``buffer``, or None.

        ``since`` is the buffer length at the previous call for this block (0 on the
        first): no end was found before it, so only the new tail needs scanning and
        a long body stays linear. Overrides must return the same answer for every
        chunking (the first end in the text, not one that depends on call timing)."""
        for s in sorted(self.starts, key=len, reverse=True):
            if buffer.startswith(s):
                e = self.end_for(s)
                if not e:
                    return None
                i = buffer.find(e, max(len(s), since - len(e) + 1))
                return None if i < 0 else i + len(e)
        return None

    def inner(self, markup: str) -> str:
        """``markup`` without its start marker and (if present) its end marker."""
        for s in sorted(self.starts, key=len, reverse=True):
            if markup.startswith(s):
                body, e = markup[len(s):], self.end_for(s)
                if e and body.endswith(e):
                    body = body[: -len(e)]
                return body
        return markup

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        raise NotImplementedError

    def whole_at_eos(self, markup: str) -> bool:
        """Whether an unclosed block that the model ended with EOS is a whole call that
        only lacks its end marker. By default only a block whose start has no end
        marker (it runs to EOS) is; a dialect may recognise more (every argument closed)."""
        for s in sorted(self.starts, key=len, reverse=True):
            if markup.startswith(s):
                return not self.end_for(s)
        return False


class StreamingToolParser:
    """Split decoded text into content, tool calls and keepalives as it streams.

    Whitespace directly around markup is held and dropped when the markup parses
    (so "\\n\\n<tool_call>…" does not leave a stray "\\n\\n" content delta); it is
    restored if the markup falls back to content."""

    def __init__(self, dialect: Dialect, tools: list | None = None,
                 keepalive_every: int = KEEPALIVE_EVERY, max_calls: int | None = None):
        # A private copy: dialects may keep per-block scan state (see complete()).
        self.dialect, self.tools = copy.copy(dialect), tools
        self.keepalive_every = keepalive_every
        self.max_calls = max_calls  # parallel_tool_calls false: 1; later calls are dropped
        self.unique = False  # forced tool choice: a repeated call ends the reply (see _admit)
        self.calls: list[ToolCall] = []
        self.done = False  # nothing more can be emitted: the reply may end here
        self._pending = ""  # text-mode text not yet emitted
        self._markup: str | None = None  # buffered markup block (None = text mode)
        self._ws = ""  # whitespace held before the current markup block
        self._ka = 0  # keepalives sent for the current block
        self._checked = 0  # markup length already scanned for an end
        self._after_call = False
        self._scanner: Scanner | None = None  # the open block's incremental reader
        self._sink: CallSink | None = None

    def call_grammar(self, tools: list) -> dict | None:
        """The dialect's grammar for one call of any of ``tools`` (see Dialect)."""
        return self.dialect.call_grammar(tools)

    def feed(self, text: str) -> list[Event]:
        ev: list[Event] = []
        if self._markup is None:
            self._pending += text
        else:  # drop the attribute's ref first so CPython grows the str in place
            buf, self._markup = self._markup, None
            buf += text
            self._markup = buf
        while True:
            if self._markup is None:
                if not self._text_step(ev):
                    return ev
            elif not self._markup_step(ev):
                return ev

    def finish(self, cut: bool = False) -> list[Event]:
        """Flush at the end of the reply. ``cut``: the budget or a stop sequence ended it
        (not the model): open markup and a held start-marker prefix are dropped."""
        ev: list[Event] = []
        if self._markup is not None:
            self._flush_open(self._markup, cut, ev)
            self._markup = None
        pending = self._pending
        if cut:
            pending = pending[: len(pending) - held_marker_prefix(pending, self.dialect.starts)]
        if pending and not (self._after_call and not pending.strip()):
            self._content(pending, ev)
        self._pending = ""
        return ev

    def _flush_open(self, markup: str, cut: bool, ev: list[Event]) -> None:
        """A block whose end marker never came (see the module docstring)."""
        if not cut and self.dialect.whole_at_eos(markup):
            self._flush_markup(markup, ev)
        else:
            streamed = self._streamed()
            if streamed is not None:
                ev.append(ToolCallWithdrawn(streamed.id))
        self._ws = ""

    def _streamed(self) -> StreamedCall | None:
        """The open block's streamed call (if any); the block's scan ends."""
        call = self._sink.call if self._sink is not None else None
        self._scanner = self._sink = None
        return call

    def _scan(self, markup: str, closed: bool, ev: list[Event]) -> None:
        if self._scanner is None or self._sink is None:
            return
        self._scanner.scan(self.dialect.body_so_far(markup, closed), self._sink)
        ev.extend(self._sink.drain())

    # -- internals
    def _content(self, s: str, ev: list[Event]) -> None:
        if s:
            ev.append(Content(s))
            self._after_call = False

    def _text_step(self, ev: list[Event]) -> bool:
        p, starts = self._pending, self.dialect.starts
        hits = [(i, s) for s in starts if (i := p.find(s)) >= 0]
        if hits:
            i = min(hits)[0]
            pre = p[:i]
            body = pre.rstrip()
            self._content(body, ev)
            self._ws, self._markup, self._pending = pre[len(body):], p[i:], ""
            self._ka = self._checked = 0
            self._scanner = self.dialect.scanner()
            room = self.max_calls is None or len(self.calls) < self.max_calls
            self._sink = CallSink(self.tools, allow=room) if self._scanner else None
            return True
        hold = held_marker_prefix(p, starts)
        body = p[: len(p) - hold]
        emit = body.rstrip()
        self._content(emit, ev)
        self._pending = p[len(emit):]
        return False

    def _markup_step(self, ev: list[Event]) -> bool:
        buf = self._markup
        assert buf is not None  # only called inside markup
        e = self.dialect.complete(buf, self._checked)
        self._checked = len(buf)
        seen = len(buf) if e is None else e - 1
        n = self.keepalive_every
        while n and (self._ka + 1) * n <= seen:
            self._ka += 1
            ev.append(KEEPALIVE)
        self._scan(buf if e is None else buf[:e], e is not None, ev)
        if e is None:
            return False
        self._markup, self._pending = None, buf[e:]
        self._flush_markup(buf[:e], ev)
        return True

    def _parse(self, markup: str) -> list[ToolCall] | None:
        try:
            return self.dialect.parse(markup, self.tools)
        except Exception:  # a dialect bug must not kill the stream
            return None

    def _flush_markup(self, markup: str, ev: list[Event]) -> None:
        calls = self._parse(markup)
        streamed = self._streamed()
        rest = ""
        if streamed is not None and calls and calls[0].name == streamed.name:
            rest = streamed.close(json.loads(calls[0].arguments))
            calls[0] = ToolCall(streamed.name, streamed.text, streamed.id)
        elif streamed is not None:  # it did not parse as the call that streamed
            ev.append(ToolCallWithdrawn(streamed.id))
            streamed = None
        if calls:
            admitted = self._admit(calls)
            for c in calls:
                taken = any(c is a for a in admitted)
                if streamed is not None and c.id == streamed.id:
                    ev.append(ToolCallDelta(c.id, rest) if taken else ToolCallWithdrawn(c.id))
                if taken:
                    ev.append(ToolCallEvent(c))
            self.calls.extend(admitted)
            self._after_call = True
        else:
            self._content(self._ws + markup, ev)
        self._ws = ""

    def _admit(self, calls: list[ToolCall]) -> list[ToolCall]:
        """Drop calls past ``max_calls`` and, when ``unique``, repeats of an earlier call
        (a small model under a forced tool choice can loop on one call); either means
        ``done``: the reply may end here."""
        seen = {(c.name, c.arguments) for c in self.calls}
        out: list[ToolCall] = []
        for c in calls:
            if (self.unique and (c.name, c.arguments) in seen) or (
                    self.max_calls is not None and len(self.calls) + len(out) >= self.max_calls):
                self.done = True
                continue
            seen.add((c.name, c.arguments))
            out.append(c)
        if self.max_calls is not None and len(self.calls) + len(out) >= self.max_calls:
            self.done = True
        return out


def split_tool_calls(dialect: Dialect, tools: list | None, text: str) -> tuple[str, list[ToolCall]]:
    """Non-streaming convenience: ``(content, calls)`` for a whole completion."""
    p = StreamingToolParser(dialect, tools, keepalive_every=0)
    ev = p.feed(text) + p.finish()
    return ("".join(e.text for e in ev if isinstance(e, Content)),
            [e.call for e in ev if isinstance(e, ToolCallEvent)])
