"""Test helpers for dialect authors: feed a text under many chunkings and compare
normalized events (adjacent content merged, calls as (name, args-dict))."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from ..events import Content, ToolCallDelta, ToolCallEvent, ToolCallStart, ToolCallWithdrawn
from .stream import Event, StreamingToolParser


def check_streamed(events: list[Event]) -> None:
    """A streamed call's pieces, joined, are its finished arguments; a call starts once
    and then ends once, as a call or withdrawn (never both)."""
    sent: dict[str, list[str]] = {}
    ended: set[str] = set()
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.call_id not in sent, e
            sent[e.call_id] = []
        elif isinstance(e, ToolCallDelta):
            assert e.call_id in sent and e.call_id not in ended, e
            sent[e.call_id].append(e.text)
        elif isinstance(e, ToolCallWithdrawn):
            assert e.call_id in sent and e.call_id not in ended, e
            ended.add(e.call_id)
        elif isinstance(e, ToolCallEvent) and e.call.id in sent:
            assert e.call.id not in ended, e
            assert "".join(sent[e.call.id]) == e.call.arguments, (sent[e.call.id], e.call)
            ended.add(e.call.id)
    assert ended == set(sent), (sent, ended)


def normalize(events: list[Event]) -> list[tuple]:
    """Adjacent content merged, calls as (name, args-dict); streamed pieces are left
    out (:func:`check_streamed` checks them)."""
    out: list[tuple] = []
    for e in events:
        if isinstance(e, (ToolCallStart, ToolCallDelta, ToolCallWithdrawn)):
            continue
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


def run_chunks(make: Callable[[], StreamingToolParser], chunks: list[str],
               cut: bool = False) -> list[tuple]:
    """Feed ``chunks``, then finish as the model's EOS would (``cut``: as the budget would)."""
    p = make()
    ev: list[Event] = []
    for c in chunks:
        ev += p.feed(c)
    ev += p.finish(cut=cut)
    check_streamed(ev)
    return normalize(ev)


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


def events_all_chunkings(make: Callable[[], StreamingToolParser], text: str,
                         cut: bool = False) -> list[tuple]:
    """The normalized events, asserting every chunking agrees."""
    runs = [run_chunks(make, c, cut) for c in chunkings(text)]
    for r in runs[1:]:
        assert r == runs[0], (r, runs[0])
    return runs[0]


# ---------------------------------------------------------------- call grammars

def walk(compiled, rng, max_steps: int = 400, p_stop: float = 0.5) -> tuple[list[int], bool]:
    """Sample tokens uniformly among those the grammar allows (a random-weights model
    at its worst) until only EOS is left; where EOS is allowed among others, stop with
    probability ``p_stop``. Returns ``(ids, finished)``; a token the mask allows but
    the matcher rejects fails the walk."""
    import numpy as np

    m = compiled.new_matcher()
    bits = np.zeros((compiled.vocab_size + 31) // 32, dtype=np.int32)
    eos = set(compiled.eos_ids)
    ids: list[int] = []
    for _ in range(max_steps):
        bits[:] = 0
        m.fill(bits)
        set_bits = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))
        allowed = [int(t) for t in set_bits if t < compiled.vocab_size]
        text = [t for t in allowed if t not in eos]
        if not text or (len(text) < len(allowed) and rng.random() < p_stop):
            return ids, True
        t = text[int(rng.integers(len(text)))]
        assert m.consume([t]), (t, m.error())
        ids.append(t)
    return ids, False


def sampled_replies(request, tokenizer, backend: str, make_parser, seeds=range(6),
                    max_steps: int = 800, p_stop: float = 0.7) -> list[tuple[str, list]]:
    """For each seed, a reply sampled under ``request`` (a grammar request) and what
    ``make_parser()`` makes of it: ``(content, calls)``."""
    import numpy as np

    from ..grammar_registry import registry

    compiled = registry.compile(request, tokenizer, backend)
    out = []
    for seed in seeds:
        ids, finished = walk(compiled, np.random.default_rng(seed), max_steps, p_stop)
        assert finished, f"{backend}: no end after {max_steps} tokens: {tokenizer.decode(ids)!r}"
        p = make_parser()
        ev = p.feed(tokenizer.decode(ids)) + p.finish()
        out.append(("".join(e.text for e in ev if isinstance(e, Content)),
                    [e.call for e in ev if isinstance(e, ToolCallEvent)]))
    return out
