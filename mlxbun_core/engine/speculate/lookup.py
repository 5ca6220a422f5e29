"""Prompt lookup: the continuation of the longest earlier match of the last n tokens.

The history (prompt + everything generated) lives in one growing numpy array. A lookup
compares the last token against the whole history in one vectorised pass, then extends
only the candidates backwards (at most ``ngram_max`` more passes over the candidates),
so its cost is one ``O(len)`` numpy comparison per decode step, never a Python loop over
the history. The longest trailing k-gram wins (``ngram_max`` down to ``ngram_min``); among
equally long matches the FIRST occurrence (Prompt Lookup Decoding, vLLM's ``ngram``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class PromptLookup:
    """A request's token history and the drafts it proposes."""

    def __init__(self, tokens: Iterable[int], ngram_max: int = 3, ngram_min: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        first = np.fromiter(tokens, dtype=np.int64)
        self._buf = np.empty(max(256, 2 * len(first)), dtype=np.int64)
        self._buf[:len(first)] = first
        self._n = len(first)

    def __len__(self) -> int:
        return self._n

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[:self._n]

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens`` (amortised: the array doubles when full)."""
        need = self._n + len(tokens)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf)), dtype=np.int64)
            grown[:self._n] = self._buf[:self._n]
            self._buf = grown
        self._buf[self._n:need] = tokens
        self._n = need

    def match(self) -> tuple[int, int]:
        """``(end, k)``: the earliest position ``end`` (exclusive) where the history's last
        ``k`` tokens occurred before, with ``k`` as long as possible; ``(0, 0)`` when even
        ``ngram_min`` tokens never did."""
        h, n = self._buf, self._n
        if n < self.ngram_min + 1:
            return 0, 0
        # candidate match ends: earlier positions holding the last token
        ends = np.flatnonzero(h[:n - 1] == h[n - 1])
        if len(ends) == 0:
            return 0, 0
        length = np.ones(len(ends), dtype=np.int64)
        alive = np.ones(len(ends), dtype=bool)
        for back in range(1, self.ngram_max):
            if n - 1 - back < 0:
                break
            pos = ends - back
            ok = alive & (pos >= 0)
            ok[ok] = h[pos[ok]] == h[n - 1 - back]
            alive = ok
            if not alive.any():
                break
            length += alive
        best = int(length.max())
        if best < self.ngram_min:
            return 0, 0
        first = int(np.argmax(length == best))  # ends are ascending: the first occurrence
        return int(ends[first]) + 1, best

    def propose(self, n: int) -> list[int]:
        """Up to ``n`` draft tokens: what followed the best earlier match (may be empty)."""
        end, k = self.match()
        if k == 0 or n <= 0:
            return []
        return [int(t) for t in self._buf[end:min(end + n, self._n)]]

    def propose_after(self, extra: list[int], n: int) -> list[int]:
        """:meth:`propose` as if ``extra`` followed the history (it is not kept)."""
        if not extra:
            return self.propose(n)
        kept = self._n
        self.extend(extra)
        try:
            return self.propose(n)
        finally:
            self._n = kept
