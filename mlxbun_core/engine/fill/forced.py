"""One request's forced-token fill: which tokens the grammar leaves no choice about.

Step-by-step constrained decoding masks the logits to the tokens the grammar allows and
samples. Where the mask allows exactly one token the draw is decided before the model
runs: any sampler picks the only finite logit. :class:`FillSession` finds that run of
single-choice tokens right after each sampled token, feeds it to the grammar matcher,
and the lane appends it to the same forward pass as the sampled token (one
multi-token forward instead of one step per token). The emitted stream is the one
step-by-step decoding produces; only the forward's shape differs (a longer query,
like a speculative verify window), which can move the next logits by float rounding.

Runs stop at: more than one allowed token, an EOS (left to the ordinary step, which
ends the reply), the span cap, and the request's token limit. Nothing is filled
while the grammar waits for a think channel to close or its budget close is steering.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from ...events import Usage
    from ...grammar.base import GrammarProcessor


class FillCounters(Protocol):
    """What a session reads and counts on the engine's fill policy (``policy.FillPolicy``)."""

    max_span: int
    events: int
    injected: int


class FillSession:
    """Per request: feeds each sampled token to the grammar and returns the forced run
    after it (already fed too). ``counters`` is the request's ``usage.fill``
    (``decodeSteps`` is derived when reported: the completion tokens not appended)."""

    def __init__(self, policy: FillCounters, grammar: GrammarProcessor, usage: Usage,
                 limit: int | None):
        self.policy, self.grammar, self.usage, self.limit = policy, grammar, usage, limit
        self.counters: dict[str, Any] = {"events": 0, "injected": 0, "strict": 0,
                                         "spanLens": []}
        usage.fill = self.counters
        compiled = grammar.compiled
        self._bits = np.zeros((compiled.vocab_size + 31) // 32, dtype=np.int32)
        self._eos = frozenset(compiled.eos_ids)

    def after(self, token: int, cap: int | None = None) -> list[int]:
        """``token`` was just sampled and is about to be fed: the tokens the grammar
        forces after it (maybe none; at most ``cap``). Both are consumed by the grammar
        matcher here, so the processor only masks the position after the run."""
        g = self.grammar
        if not self.ready():
            return []
        g.consume([token])
        room = self.room(0) if cap is None else min(cap, self.room(0))
        run: list[int] = []
        while len(run) < room and g.error is None and not g.stopped:
            forced = self.single()
            if forced is None:
                break
            g.consume([forced])
            run.append(forced)
        self.count(len(run))
        return run

    def room(self, ahead: int) -> int:
        """The longest run the next forward may carry: the span cap, and the completion
        limit (``ahead``: tokens produced but not yet handed to the text session)."""
        room = self.policy.max_span
        if self.limit is not None:  # the run counts against the completion limit
            room = min(room, self.limit - self.usage.completion_tokens - ahead - 1)
        return room

    def count(self, run: int) -> None:
        """A forced run of ``run`` tokens rode in a forward (the request's and the
        engine's counters)."""
        if run:
            c = self.counters
            c["events"] += 1
            c["injected"] += run
            c["strict"] += run
            c["spanLens"].append(run)
            self.policy.events += 1
            self.policy.injected += run

    def ready(self) -> bool:
        """Whether the matcher tracks the reply token by token now (not before the
        processor's first call, not inside a think channel, not once it failed, ended
        or its budget close took over)."""
        g = self.grammar
        budget = g.budget
        return (g.prompt_len is not None and g.wait_for is None and g.error is None
                and not g.stopped and not (budget is not None and budget.closing))

    def single(self) -> int | None:
        """The one token the grammar allows next, or None (several, or only EOS)."""
        bits = self._bits
        self.grammar.matcher.fill(bits)
        nz = np.flatnonzero(bits)
        if len(nz) != 1:
            return None
        word = int(bits[nz[0]]) & 0xFFFFFFFF
        if word & (word - 1):
            return None
        token = int(nz[0]) * 32 + word.bit_length() - 1
        return None if token in self._eos else token
