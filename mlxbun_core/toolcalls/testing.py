"""Test helpers for dialect authors: feed a text under many chunkings and compare
normalized events (adjacent content merged, calls as (name, args-dict))."""

from __future__ import annotations

import json
import random
from typing import Callable

from ..events import Content, ToolCallEvent
from .stream import Event, StreamingToolParser


def normalize(events: list[Event]) -> list[tuple]:
    out: list[tuple] = []
    for e in events:
        if isinstance(e, Content):
            if out and out[-1][0] == "content":
                out[-1] = ("content", out[-1][1] + e.text)
            else:
                out.append(("content", e.text))
        elif isinstance(e, ToolCallEvent):
            out.append(("tool_call", e.call.name, json.loads(e.call.arguments)))
        else:
            out.append((e.kind,))
    return out


def run_chunks(make: Callable[[], StreamingToolParser], chunks: list[str]) -> list[tuple]:
    p = make()
    ev: list[Event] = []
    for c in chunks:
        ev += p.feed(c)
    return normalize(ev + p.finish())


def chunkings(text: str, seeds: int = 8) -> list[list[str]]:
    """Whole text, char-by-char and ``seeds`` random splits."""
    out = [[text], list(text)]
    for s in range(seeds):
        rng, i, parts = random.Random(s), 0, []
        while i < len(text):
            n = rng.randint(1, 40)
            parts.append(text[i:i + n])
            i += n
        out.append(parts)
    return out


def events_all_chunkings(make: Callable[[], StreamingToolParser], text: str) -> list[tuple]:
    """The normalized events, asserting every chunking agrees."""
    runs = [run_chunks(make, c) for c in chunkings(text)]
    for r in runs[1:]:
        assert r == runs[0], (r, runs[0])
    return runs[0]
