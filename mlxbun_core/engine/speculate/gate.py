"""Whether a stream's drafts are landing, so worth sending: the one gate every drafter
shares (prompt lookup on a lone stream, the serial lane and batch rows; the MTP head on
a lone stream, with a grammar or without, and on batch rows).

A window with drafts costs more than a plain step (it is wider, and the host must read
its samples before the next step is queued), so drafts ride only while they land:
after a round that kept one, or after ``HIT_STREAK`` free checks in a row came true (a
guess made without sending it, checked against the token then sampled there). A round
that keeps none turns drafting off until the checks say otherwise.

A lookup's guess is free, so its gate checks one every step. An MTP batch row's costs a
head call (the head reads the row's pending states to make it), so its gate backs off:
a cold row checks at once, then on every 2nd, 4th... step after each miss (``backoff``,
a power of two, caps the period), and the step after a check that came true.
The steps are counted by the batch, so cold rows check on the same steps, in one head
call; the states a row skipped meanwhile join its head then, in that call.
"""

from __future__ import annotations

from .config import HIT_STREAK


class LandingGate:
    """One stream's (or batch row's) drafting switch, :attr:`hot` (module docstring)."""

    __slots__ = ("hot", "streak", "backoff", "misses")

    def __init__(self, hot: bool = False, backoff: int = 1):
        self.hot = hot
        self.streak = 0  # free checks in a row that came true
        self.backoff = backoff  # the longest period of a cold stream's checks
        self.misses = 0  # free checks in a row that missed

    def landed(self, accepted: int) -> None:
        """A round that sent drafts kept ``accepted`` of them."""
        self.hot = accepted > 0
        self.streak = HIT_STREAK if self.hot else 0
        self.misses = 0

    def checked(self, hit: bool) -> None:
        """A free check: the guess equalled the token sampled there (``hit``) or not."""
        self.streak = self.streak + 1 if hit else 0
        self.hot = self.streak >= HIT_STREAK
        # the backoff stays where it was until the gate opens (a lone hit among misses
        # only buys the next step's check)
        self.misses = 0 if self.hot else self.misses + (not hit)

    def due(self, step: int) -> bool:
        """Whether the stream guesses at batch step ``step``: always while hot or while
        checks come true, else on the steps the period after its misses divides."""
        if self.hot or self.streak:
            return True
        return step % min(1 << self.misses, self.backoff) == 0
