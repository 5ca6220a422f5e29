"""Incremental text filters that run on every decoded segment.

Each filter holds back text it cannot decide on yet (a possible stop sequence,
a possible think marker), so nothing is ever sent that must later be retracted.
"""

from __future__ import annotations

from ..events import Content, Event, Reasoning
from ..holdback import held_marker_prefix


class StopMatcher:
    """Finds stop sequences in decoded text; no part of a stop is ever emitted."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped: str | None = None

    def feed(self, text: str) -> str:
        if self.stopped is not None:
            return ""
        if not self.stops:
            return text
        buf = self.pending + text
        # the first stop to COMPLETE wins (as if fed one character at a time, so the
        # result never depends on how the text was chunked); at a tie, the longest
        hits = [(buf.find(s) + len(s), buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            _, pos, self.stopped = min(hits)
            self.pending = ""
            return buf[:pos]
        keep = held_marker_prefix(buf, self.stops)
        self.pending = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class ReasoningSplitter:
    """Routes text inside ``<think>…</think>`` to reasoning, the rest to content."""

    def __init__(self, start: str | None, end: str | None, in_reasoning: bool = False):
        self.start, self.end = start, end
        self.inside = in_reasoning
        self.pending = ""
        self.seen_any = in_reasoning
        self._lstrip = False  # drop the newlines a model puts right after a marker

    def feed(self, text: str) -> list[Event]:
        """``Content`` / ``Reasoning`` events for the text that is decided."""
        if not self.start and not self.inside:
            return [Content(text)] if text else []
        out: list[Event] = []
        buf = self.pending + text
        while buf:
            marker = self.end if self.inside else self.start
            if not marker:  # no start marker: only the channel the prompt opened
                self._emit(out, buf)
                buf = ""
                break
            pos = buf.find(marker)
            if pos >= 0:
                self._emit(out, buf[:pos])
                buf = buf[pos + len(marker):]
                self.inside = not self.inside
                self.seen_any = True
                self._lstrip = True  # a model's newline right after either marker is framing
                continue
            keep = held_marker_prefix(buf, [marker])
            self._emit(out, buf[: len(buf) - keep])
            buf = buf[len(buf) - keep:] if keep else ""
            break
        self.pending = buf
        return out

    def _emit(self, out: list[Event], text: str) -> None:
        if text and self._lstrip:
            text = text.lstrip("\n")
            self._lstrip = not text
        if text:
            out.append(Reasoning(text) if self.inside else Content(text))

    def flush(self) -> list[Event]:
        out: list[Event] = []
        self._emit(out, self.pending)
        self.pending = ""
        return out
