"""What a backend compiles to, and the per-request logits processor that masks with it.

A backend only has to compile a :class:`GrammarRequest` into something that makes
matchers (consume tokens / fill a 32-bit-per-word allowed-token bitmask); masking,
EOS-only completion and vocab padding live here once for all backends. Which backends
exist, the compile cache and the degrade path are :mod:`mlxbun_core.grammar_registry`.
Nothing here knows the plugin machinery.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, cast

import mlx.core as mx
import numpy as np

from .budget import Budget, ByteVocab, CloseSearch
from .request import GrammarRequest

log = logging.getLogger("mlxbun.grammar")


class GrammarCompileError(Exception):
    """The constraint cannot be enforced; the message becomes the Warning reason."""


class Matcher(Protocol):
    def consume(self, ids: list[int]) -> bool: ...          # False: token rejected
    def fill(self, bits: np.ndarray) -> None: ...           # 1-D int32, (vocab+31)//32 words
    def error(self) -> str | None: ...
    # for the budget-aware close (:mod:`.budget`), which searches on copies:
    def fork(self) -> Matcher: ...                        # an independent copy
    def try_token(self, token: int) -> bool: ...            # consume if allowed, else no change
    def accepting(self) -> bool: ...                        # the grammar may end here
    # for speculation under the grammar (rejected drafts taken back):
    def rollback(self, n: int) -> None: ...                 # undo the last ``n`` consumed


@dataclass
class CompiledGrammar:
    """A backend's compiled artefact; ``new_matcher`` is called once per request.
    ``vocab``: what the budget-aware close needs from the tokenizer (None: no close)."""
    backend: str
    request: GrammarRequest
    vocab_size: int                 # tokenizer ids covered by the bitmask
    eos_ids: tuple
    new_matcher: Callable[[], Matcher]
    vocab: ByteVocab | None = None


def hf_tokenizer(tokenizer):
    """An HF fast tokenizer over the same vocabulary as ``tokenizer`` (an mlx-lm
    TokenizerWrapper, or one already): built on the Rust tokenizer the wrapper hands out
    publicly (``backend_tokenizer``), since mlx-lm keeps its HF object private. It has the
    same tokens, added tokens and encoding; special-token names (eos) come from the
    wrapper itself."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)


def eos_ids(tokenizer) -> list[int]:
    ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
    eid = getattr(tokenizer, "eos_token_id", None)
    if eid is not None:
        ids.add(eid)
    return sorted(ids)


@lru_cache(maxsize=16)
def _gather_index(n_logits: int, vocab: int):
    """Word index + bit shift per logit id; ids past the tokenizer read the always-zero
    pad word, so model-only ids (padded embedding rows) are masked."""
    ids = np.arange(n_logits)
    words = np.where(ids < vocab, ids // 32, (vocab + 31) // 32).astype(np.int32)
    return mx.array(words), mx.array((ids % 32).astype(np.int32))


@mx.compile
def _apply(logits, bits, words, shifts):
    allowed = mx.bitwise_and(mx.right_shift(bits[words], shifts), 1)
    return mx.where(allowed.astype(mx.bool_), logits, mx.array(-mx.inf, logits.dtype))


class GrammarProcessor:
    """mlx-lm logits processor ``(tokens, logits) -> logits`` owning one matcher.

    ``tokens`` is everything mlx-lm has seen (prompt passed to generate_step +
    generated); ids after ``prompt_len`` are fed to the matcher once each. When
    ``prompt_len`` is None it is taken from the first call (mlx-lm's first call sees
    exactly the prompt). ``done`` turns True once only EOS may follow (or EOS was
    consumed): the engine can stop with finish_reason "stop" right there.

    With :meth:`set_budget` (the request's completion limit) the reply closes within
    it (see :mod:`.budget`); ``forced_from`` is then the completion index where the
    close first overrode a choice the grammar left open, or None.
    """

    def __init__(self, compiled: CompiledGrammar, prompt_len: int | None = None):
        self.compiled = compiled
        self.matcher = compiled.new_matcher()
        self.prompt_len = prompt_len
        self.base = prompt_len          # where completion indices start (thinking included)
        self.consumed = 0
        self.done = False
        self.stopped = False            # EOS consumed
        self.error: str | None = None
        self.budget: Budget | None = None
        self.close_on_budget = True     # the request's switch (``budget_close``)
        # the request's sampler: guards the last steps
        self.sampler: Callable[[mx.array], mx.array] | None = None
        n = (compiled.vocab_size + 31) // 32
        self._bits = np.zeros(n + 1, dtype=np.int32)   # +1: pad word, always 0
        self._view = self._bits[:n]
        eos = np.zeros(n, dtype=np.uint32)
        for e in compiled.eos_ids:
            if e < compiled.vocab_size:
                eos[e // 32] |= np.uint32(1 << (e % 32))
        self._eos_bits = eos.view(np.int32)
        self._not_eos = np.invert(self._eos_bits)
        # the budget's watch after each recent mask, by tokens consumed: a rollback puts
        # back the one of the last kept position, as if no draft had been looked at
        self._watch: dict[int, Budget] = {}

    def start_after(self, marker_ids) -> None:
        """Leave the logits alone until the model has generated ``marker_ids`` (the end
        of a think channel the prompt opened); the grammar constrains what follows."""
        self.wait_for = tuple(marker_ids) or None

    wait_for: tuple | None = None

    def set_budget(self, limit: int | None) -> None:
        """Close within ``limit`` completion tokens (unless switched off or no search)."""
        vocab = self.compiled.vocab
        if limit is None or not self.close_on_budget or vocab is None:
            self.budget = None
            return
        search = CloseSearch(vocab, self.compiled.vocab_size, self.compiled.eos_ids)
        self.budget = Budget(search, limit, self.sampler)

    @property
    def forced_from(self) -> int | None:
        return None if self.budget is None else self.budget.forced_from

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.prompt_len is None:
            self.prompt_len = tokens.shape[0]
        if self.base is None:
            self.base = self.prompt_len
        index = tokens.shape[0] - self.base   # the completion token this mask is for
        if self.wait_for is not None:
            n = len(self.wait_for)
            if (tokens.shape[0] - self.prompt_len >= n
                    and tuple(_ids(tokens[-n:])) == self.wait_for):
                self.prompt_len, self.wait_for = tokens.shape[0], None
            else:
                return self._thinking(tokens, logits, index)  # still thinking: free text
        new = tokens.shape[0] - self.prompt_len - self.consumed
        if new > 0:
            self.consume(_ids(tokens[-new:]))
        forced, budget = None, self.budget
        if budget is not None and (budget.closing or index >= budget.next_check) \
                and self.error is None and not self.stopped:
            forced = budget.choose(self.matcher, index, lambda: self._masked(logits))
        if forced is not None and budget is not None:
            # a guarded draw is the model's; a close token may not be
            if budget.closing and budget.forced_from is None and self._narrows(forced):
                budget.forced_from = index
            self._only(forced)
        elif self.error is None and not self.stopped:
            self._fill()
        else:
            self._view[:] = self._eos_bits
            self.done = True
        if budget is not None:  # kept for :meth:`rollback` (a window's positions)
            self._watch[self.consumed] = _budget_copy(budget)
            if len(self._watch) > WATCH_KEPT:
                del self._watch[min(self._watch)]
        return self._mask(logits)

    def tracking(self) -> bool:
        """Whether the matcher follows the reply token by token now and nothing but the
        mask can act on it: not before the first call, not inside a think channel, not
        once failed or ended, not once the budget close steers. Only then may drafts
        ride (see :meth:`draft_prefix`)."""
        budget = self.budget
        return (self.prompt_len is not None and self.wait_for is None and self.error is None
                and not self.stopped and not (budget is not None and budget.closing))

    def draft_prefix(self, tokens: list[int], drafts: list[int]) -> int:
        """How many of ``drafts`` the grammar allows in a row after ``tokens`` (the whole
        context up to and including the token fed before them; its unconsumed tail is
        consumed here, as the next mask call would). A forbidden token, an EOS, or one
        after which only EOS may follow ends the draft: the last token of a reply is
        always sampled, so :attr:`done` keeps meaning "after the token just handed out"."""
        if not drafts or not self.catch_up(tokens):
            return 0
        n = 0
        for t in drafts:
            if not self.try_draft(t):
                break
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def catch_up(self, tokens: list[int]) -> bool:
        """Consume the unconsumed tail of ``tokens`` (the whole context), as the next mask
        call would; whether the matcher still tracks the reply (:meth:`tracking`)."""
        if not self.tracking():
            return False
        assert self.prompt_len is not None  # tracking
        new = len(tokens) - self.prompt_len - self.consumed
        if new > 0:
            self.consume(tokens[-new:])
        return self.tracking()

    def try_draft(self, token: int) -> bool:
        """Advance the matcher by ``token`` if it may ride as a draft: allowed, not EOS,
        and not one after which only EOS may follow (the caller rolls it back)."""
        m = self.matcher
        if token in self.compiled.eos_ids or not m.try_token(token):
            return False
        m.fill(self._view)
        if not np.bitwise_and(self._view, self._not_eos).any():
            m.rollback(1)  # only EOS may follow it: it is left to be sampled
            return False
        return True

    def mask_guess(self, logits: mx.array) -> mx.array:
        """``logits`` under what the matcher allows now, EOS left out: a drafter's guess
        (the MTP head's) then is a token the grammar lets ride."""
        self.matcher.fill(self._view)
        np.bitwise_and(self._view, self._not_eos, out=self._view)
        return self._mask(logits)

    def only_eos(self) -> bool:
        """Whether only EOS may follow the matcher's current state."""
        self.matcher.fill(self._view)
        return not np.bitwise_and(self._view, self._not_eos).any()

    def rollback(self, n: int) -> None:
        """Take back the last ``n`` consumed tokens (drafts the target rejected)."""
        if n > 0:
            self.matcher.rollback(n)
            self.consumed -= n
            self.done = False
            kept = self._watch.get(self.consumed)
            if kept is not None and self.budget is not None:
                # the budget's watch as it stood after the last kept position's mask
                self.budget.__dict__.update(_budget_copy(kept).__dict__)

    def consume(self, ids: list) -> None:
        """Advance the matcher by ``ids``, tokens fed to the model after those consumed
        (a fill session's forced run is fed this way), and count them in
        :attr:`consumed`. Past an error or an EOS they are only counted."""
        self.consumed += len(ids)
        if self.error is not None or self.stopped:
            return
        eos = self.compiled.eos_ids
        cut = next((i for i, t in enumerate(ids) if t in eos), None)
        if cut is not None:     # EOS ends it (only allowed where accepting): not fed,
            ids, self.stopped = ids[:cut], True  # mlx-lm may call once past it
        if ids and not self.matcher.consume(ids):
            self.error = self.matcher.error() or f"token(s) {ids} rejected by grammar"
            log.warning("grammar matcher failed, forcing EOS: %s",
                        self.error.splitlines()[0][:300] if self.error else "")

    def _fill(self) -> None:
        self.matcher.fill(self._view)
        if np.bitwise_and(self._view, self._eos_bits).any():
            np.bitwise_or(self._view, self._eos_bits, out=self._view)
        self.done = not np.bitwise_and(self._view, self._not_eos).any()

    def _narrows(self, token: int) -> bool:
        """Whether forcing ``token`` takes away a choice the grammar leaves open."""
        self._fill()
        if token in self.compiled.eos_ids or token < 0:
            return bool(np.bitwise_and(self._view, self._not_eos).any())
        word = int(self._view[token // 32]) & 0xFFFFFFFF
        return bool(np.count_nonzero(self._view) > 1 or word & (word - 1))

    def _only(self, token: int) -> None:
        """Allow exactly ``token`` (an EOS id: every EOS id)."""
        if token in self.compiled.eos_ids or token < 0:
            self._view[:] = self._eos_bits
            self.done = True
            return
        self._view[:] = 0
        self._view[token // 32] = np.uint32(1 << (token % 32)).view(np.int32)
        self.done = False

    def _masked(self, logits: mx.array) -> mx.array:
        """The logits under the grammar's own mask (the budget's guard samples these)."""
        self._fill()
        return self._mask(logits)

    def _mask(self, logits: mx.array) -> mx.array:
        words, shifts = _gather_index(logits.shape[-1], self.compiled.vocab_size)
        return _apply(logits, mx.array(self._bits), words, shifts)

    def _thinking(self, tokens: mx.array, logits: mx.array, index: int) -> mx.array:
        """Free text, unless the budget needs the think channel closed now to leave room
        for the marker and the shortest constrained answer: then the marker is forced."""
        marker = self.wait_for
        if (marker is None or self.budget is None
                or not self.budget.thinking(self.matcher, index, len(marker))):
            return logits
        tail = _ids(tokens[-len(marker):])  # how much of the marker is already out
        done = next(k for k in range(len(marker) - 1, -1, -1)
                    if k == 0 or tail[len(tail) - k:] == list(marker[:k]))
        self._only(marker[done])
        return self._mask(logits)


WATCH_KEPT = 64  # masks back a rollback may reach (far more than a draft is long)


def _budget_copy(budget: Budget) -> Budget:
    """An independent copy of a budget's watch (its lists copied, the search shared)."""
    out = copy.copy(budget)
    out.queue = list(budget.queue)
    out.path = None if budget.path is None else list(budget.path)
    return out


def _ids(tokens: mx.array) -> list[int]:
    """A 1-D token array as ids (MLX types ``tolist`` loosely)."""
    return cast("list[int]", tokens.tolist())


def make_processor(compiled: CompiledGrammar, prompt_len: int | None = None) -> GrammarProcessor:
    return GrammarProcessor(compiled, prompt_len)


@dataclass
class GrammarPlan:
    """What the engine/server does for one request. ``processor``: append last to the
    logits processors. ``warning``: send as ``Warning`` header. ``instruction``: chat
    only, prepend as a system message (degrade path)."""
    processor: GrammarProcessor | None = None
    warning: str | None = None
    instruction: str | None = None
    request: GrammarRequest | None = None

    @property
    def whole_reply(self) -> bool:
        """The grammar shapes the whole reply (not free text with constrained tool
        calls in it): stop strings and think markers must not cut into it."""
        if self.processor is None:
            return False
        req = self.request
        return not (req is not None and req.kind == "structural"
                    and req.value["format"].get("type") == "triggered_tags")
