"""Budget-aware close: a constrained reply that ends complete even when ``max_tokens``
runs out first.

Neither backend can say how far its matcher is from an end, so :class:`CloseSearch`
finds out on a copy of the matcher: it walks one single-byte token at a time, closers
first (``"``, ``}``, ``]``, then the shortest values), until the grammar may end; the
bytes found are then re-tokenized canonically (fewer, longer tokens) when the matcher
takes them that way. That path's length is the *close distance*: an upper bound on the
tokens still needed (a single-byte token per byte is the safe count).

:class:`Budget` watches one request. A close is never longer than :data:`MAX_STEPS`, so
nothing is measured until the reply is that close to its limit (most replies end long
before: they cost nothing). Then it re-measures the distance now and then (the gap
shrinks by at most one token per token plus the growth of the distance, assumed at most
:data:`GROWTH` per token between checks). Within :data:`NEAR` tokens of slack it
measures every step and guards the model's choice: the token the request's own sampler
draws is kept only if the reply can still close after it (otherwise it is banned and
another is drawn), so no single token can push the end out of reach. When the distance
reaches the tokens left it forces the path token by token, then EOS, and records the
first step where that overrode a choice the grammar left open (``forced_from``; markup
the grammar fixes anyway is not a cut): the reply parses, and the engine reports
``finish_reason: "length"``.

Where the search finds no end within :data:`MAX_STEPS` bytes (free text that only a
multi-character marker ends, a pattern the byte order cannot satisfy) the request runs
as before and may be cut. JSON (``json_object``, ``json_schema``, ``structured_outputs``)
always closes: strings, arrays and objects are ended and required keys filled with short
values the schema allows (given a budget that holds the shortest valid reply).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

NEAR = 32
"""Slack (tokens left minus close distance) under which every step is measured and guarded."""
GROWTH = 4
"""Assumed most growth of the close distance per token between two far checks."""
TRIES = 3
"""Draws tested per guarded step before the close is forced."""
MAX_STEPS = 384
"""Most bytes one close search walks before it gives up: no close is longer, so a reply
needs no look at all until it is this many tokens (plus :data:`NEAR`) from its limit."""
BACKOFF = 8
"""Tokens to wait after a search that found no end (doubling while none is found)."""
REJUMP = 32
"""Tokens after which the one-token jump (:meth:`CloseSearch.reach`) is measured again."""

FIRST = b'}]0",:'
REST = (string.ascii_lowercase + "123456789" + string.ascii_uppercase
        + string.punctuation + " \n\t").encode()
PRIORITY = tuple(dict.fromkeys(FIRST + REST + bytes(range(0x80, 0xC0)) + bytes(range(256))))
"""Byte order the search tries (after a quote that closes a string): closers, the
shortest value, an empty string, separators, letters, digits, the rest of ASCII,
whitespace (only where the layout requires it), UTF-8 continuation bytes (to finish a
character a token split), then anything."""
TRIED_ONE_BY_ONE = len(FIRST)
OPENERS = b',{["'
"""Bytes whose one token can open more structure than the close path shows
(:meth:`CloseSearch.reach`)."""
"""Candidates tried one at a time before a step reads the whole mask instead."""


def _kind(b: int) -> str | None:
    c = chr(b)
    if c.isalpha() or b >= 0x80:
        return "letter"
    if c.isdigit():
        return "digit"
    if c.isspace():
        return "space"
    return "punct" if c in string.punctuation else None


KIND = [_kind(b) for b in range(256)]
LOOP = 3
"""Same-class bytes in a row after which the walk tries other classes first."""


@dataclass
class _Order:
    """Byte tokens in the order to try, and where their bits sit in a mask."""

    pairs: list
    words: np.ndarray = field(init=False)
    shifts: np.ndarray = field(init=False)

    def __post_init__(self):
        ids = np.array([t for _, t in self.pairs], dtype=np.int64)
        self.words, self.shifts = ids // 32, (ids % 32).astype(np.int32)


@dataclass
class ByteVocab:
    """What the search needs from a tokenizer, built once per backend and tokenizer:
    ``byte_ids`` maps a byte to the token that is exactly that byte (where the
    vocabulary has one), ``encode`` tokenizes a run of bytes canonically, and
    ``lengths()`` gives every token's byte length (for a step no byte token can take)."""

    byte_ids: dict
    encode: Callable[[bytes], list]
    lengths: Callable[[], np.ndarray]

    def __post_init__(self):
        pairs = [(b, self.byte_ids[b]) for b in PRIORITY if b in self.byte_ids]
        self.byte_of = {t: b for b, t in pairs}
        self.orders = {None: _Order(pairs)}  # and one per looping class: that class last
        for kind in set(KIND) - {None}:
            self.orders[kind] = _Order([x for x in pairs if KIND[x[0]] != kind]
                                       + [x for x in pairs if KIND[x[0]] == kind])

    def looping(self, walked: list) -> str | None:
        """The class of byte the walk just repeated :data:`LOOP` times, if any."""
        if len(walked) < LOOP:
            return None
        kinds = {KIND[self.byte_of[t]] if t in self.byte_of else None for t in walked[-LOOP:]}
        return kinds.pop() if len(kinds) == 1 else None


class CloseSearch:
    """Finds a short token path from a matcher's state to one where the grammar may end."""

    def __init__(self, vocab: ByteVocab, vocab_size: int, eos_ids: tuple):
        self.vocab, self.vocab_size, self.eos = vocab, vocab_size, set(eos_ids)
        self._quote = vocab.byte_ids.get(ord('"'))
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def path(self, matcher, hint: list | None = None) -> list | None:
        """Tokens that end the grammar from ``matcher``'s state (left unchanged), or None.
        ``hint``: a path found earlier; reused when it still ends the grammar from here."""
        if hint is not None and self.ends(matcher, hint):
            return hint
        m = matcher.fork()
        walked: list = []
        while not m.accepting():
            if len(walked) >= MAX_STEPS:
                return None
            t = self._next(m, self.vocab.looping(walked))
            if t is None:
                return None
            walked.append(t)
        return self._shorter(matcher, walked)

    def reach(self, matcher, path: list) -> int:
        """The longest close one more token can commit the reply to: ``path`` itself, or
        at any point along it a byte that opens another item, member or value (a comma
        or brace after which an object of four required keys must be written whole).
        The budget starts guarding while that is in sight, not only ``path``."""
        openers = [t for b in OPENERS if (t := self.vocab.byte_ids.get(b)) is not None]
        worst, m = len(path), matcher.fork()
        for i, t in enumerate([*path, None]):
            for opener in openers:
                probe = m.fork()
                if probe.try_token(opener) and (after := self.path(probe)) is not None:
                    worst = max(worst, i + 1 + len(after))
            if t is None or not m.try_token(t):
                break
        return worst

    def ends(self, matcher, path: list) -> bool:
        """Whether ``path`` takes ``matcher`` (left unchanged) to where the grammar may end."""
        m = matcher.fork()
        return all(m.try_token(t) for t in path) and m.accepting()

    def _next(self, m, looping: str | None = None) -> int | None:
        """Take one step on ``m``: the first byte token in priority order, except that a
        quote which opens a string gives way to a closing brace or bracket. ``looping``:
        the class of byte the walk repeats, tried last (``[a-z]+`` is ended by what
        follows the letters, not by more of them)."""
        q = self._quote
        if q is not None and looping is None:
            probe = m.fork()
            if probe.try_token(q) and not probe.fork().try_token(q):
                m.try_token(q)  # it closed a string (another quote cannot follow)
                return q
        order = self.vocab.orders[looping]
        for _, t in order.pairs[:TRIED_ONE_BY_ONE]:
            if m.try_token(t):
                return t
        bits = self._mask(m)  # the rest at once: the first allowed byte token in order
        allowed = (bits[order.words] >> order.shifts) & 1
        for i in np.flatnonzero(allowed[TRIED_ONE_BY_ONE:])[:4]:
            t = order.pairs[TRIED_ONE_BY_ONE + int(i)][1]
            if m.try_token(t):
                return t
        return self._any(m, bits)

    def _mask(self, m) -> np.ndarray:
        self._bits[:] = 0
        m.fill(self._bits)
        return self._bits

    def _any(self, m, bits: np.ndarray) -> int | None:
        """No single byte fits (a special token, or bytes only a longer token spells):
        the shortest token the grammar allows here (``bits``: the mask)."""
        set_bits = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))
        allowed = [int(t) for t in set_bits if t < self.vocab_size and t not in self.eos]
        if not allowed:
            return None
        lengths = self.vocab.lengths()
        t = min(allowed, key=lambda i: (lengths[i] if i < len(lengths) else 1 << 20, i))
        return t if m.try_token(t) else None

    def _shorter(self, matcher, walked: list) -> list:
        """``walked`` with each run of byte tokens re-tokenized canonically, where the
        matcher takes the result: usually several bytes per token."""
        out, run = [], bytearray()
        byte_of = self.vocab.byte_of
        for t in walked + [None]:
            if t is not None and t in byte_of:
                run.append(byte_of[t])
                continue
            if run:
                out += self._tokens(bytes(run))
                run = bytearray()
            if t is not None:
                out.append(t)
        if len(out) < len(walked) and self.ends(matcher, out):
            return out
        return walked

    def _tokens(self, data: bytes) -> list:
        try:
            ids = list(self.vocab.encode(data))
        except Exception:  # not valid text on its own (a split character): bytes then
            ids = []
        if not ids or len(ids) > len(data):
            return [self.vocab.byte_ids[b] for b in data]
        return ids


@dataclass
class Budget:
    """One request's budget watch (see the module docstring). ``limit`` counts every
    completion token, thinking included; indices are completion-token positions."""

    search: CloseSearch
    limit: int
    sampler: Callable | None = None
    closing: bool = False                 # the close path is being forced
    forced_from: int | None = None     # where forcing first overrode the grammar's choice
    next_check: int = 0
    queue: list = field(default_factory=list)
    path: list | None = None
    known_at: int = -1                    # the index whose state ``path`` was found for
    start_distance: int | None = None
    backoff: int = BACKOFF
    jump: int | None = None               # the last measured jump (``_jump``)
    jump_at: int = 0
    jump_len: int = 0

    def __post_init__(self):
        self.next_check = max(0, self.limit - NEAR - MAX_STEPS)  # nothing to look at before

    def choose(self, matcher, index: int, masked: Callable) -> int | None:
        """The token this step must take, or None for the model's own choice. ``masked()``
        gives the logits under the grammar's mask (only called in the guarded zone)."""
        left = self.limit - index
        if self.closing:
            return self.queue.pop(0) if self.queue else self._eos()
        if index < self.next_check or left <= 0:
            return None
        if self.known_at != index or self.path is None:  # (a guarded draw found it already)
            self.path = self.search.path(matcher, self.path)
        path = self.path
        if path is None:  # no end found from here: look again later, less and less often
            self.next_check, self.backoff = index + self.backoff, self.backoff * 2
            return None
        self.backoff = BACKOFF
        slack = left - len(path)
        if slack <= 0:
            return self.force(index, path)
        if slack > NEAR:
            far = slack - self._jump(matcher, index, path) - NEAR
            if far > 0:
                self.next_check = index + max(1, far // (1 + GROWTH))
                return None
        return self._guard(matcher, index, left, masked, path)

    def _jump(self, matcher, index: int, path: list) -> int:
        """How far one token may push the close beyond ``path`` (see
        :meth:`CloseSearch.reach`). Measured again once the path grew (the reply entered
        new structure) or :data:`REJUMP` tokens on; in between the last measure stands."""
        stale = (self.jump is None or len(path) > self.jump_len + GROWTH
                 or index - self.jump_at >= REJUMP)
        if stale:
            self.jump = self.search.reach(matcher, path) - len(path)
            self.jump_at, self.jump_len = index, len(path)
        return self.jump or 0

    def force(self, index: int, path: list) -> int:
        """Start the close at ``index``: ``path``, then EOS. (Whether a forced token
        overrode anything is the processor's to tell: see ``forced_from``.)"""
        self.closing = True
        self.queue = list(path[1:])
        return path[0] if path else self._eos()

    def _eos(self) -> int:
        return min(self.search.eos) if self.search.eos else -1

    def _guard(self, matcher, index: int, left: int, masked: Callable, path: list) -> int | None:
        """Draw as the request's sampler would; keep a token after which the reply can
        still close within ``left - 1`` tokens."""
        if self.sampler is None:
            return None if left - len(path) > GROWTH else self.force(index, path)
        import mlx.core as mx

        logits = masked()
        for _ in range(TRIES):
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            t = int(self.sampler(logprobs).item())
            if t in self.search.eos:
                return t
            after = self._after(matcher, t, path)
            if after is not None and len(after) <= left - 1:
                self.path, self.known_at = after, index + 1  # the next step's state
                return t
            logits = _ban(logits, t)
        return self.force(index, path)

    def _after(self, matcher, token: int, hint: list) -> list | None:
        """The close path once ``token`` is taken (None: rejected, or no end found)."""
        m = matcher.fork()
        if not m.try_token(token):
            return None
        return self.search.path(m, hint[1:] if hint and hint[0] == token else hint)

    def thinking(self, matcher, index: int, marker_left: int) -> bool:
        """While a think channel runs: whether to force its end marker now, leaving room
        for the marker and the shortest constrained answer."""
        if self.limit - index > marker_left + MAX_STEPS:
            return False
        if self.start_distance is None:
            p = self.search.path(matcher)
            self.start_distance = len(p) if p is not None else -1
        if self.start_distance < 0:
            return False
        if self.limit - index <= marker_left + self.start_distance:
            if self.forced_from is None:  # cutting the thinking short
                self.forced_from = index
            return True
        return False


def _ban(logits, token: int):
    import mlx.core as mx

    mask = mx.arange(logits.shape[-1]) == token
    return mx.where(mask, mx.array(-mx.inf, logits.dtype), logits)
