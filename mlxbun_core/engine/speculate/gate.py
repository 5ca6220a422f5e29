"""Whether a stream's drafts are landing, so worth sending: the one gate every drafter
shares (prompt lookup on a lone stream, the serial lane and batch rows; the MTP head on
the serial lane under a grammar and on batch rows).

A window with drafts costs more than a plain step (it is wider, and the host must read
its samples before the next step is queued), so drafts ride only while they land:
after a round that kept one, or after ``HIT_STREAK`` free checks in a row came true (a
guess made without sending it, checked against the token then sampled there). A round
that keeps none turns drafting off until the checks say otherwise.

A lookup's guess is free, so its gate checks one every step. An MTP batch row's costs a
head call (the head reads the row's pending states to make it), so its gate backs off:
a cold row checks at once, then waits 1, 3, 7... steps after each miss (``backoff``
caps the wait), and checks every step again while its guesses come true. The states it
skipped meanwhile join the head at its next check, in one call.
"""

from __future__ import annotations

from .config import HIT_STREAK


class LandingGate:
    """One stream's (or batch row's) drafting switch, :attr:`hot` (module docstring)."""

    __slots__ = ("hot", "streak", "backoff", "misses", "idle")

    def __init__(self, hot: bool = False, backoff: int = 1):
        self.hot = hot
        self.streak = 0  # free checks in a row that came true
        self.backoff = backoff  # the most steps between a cold stream's checks
        self.misses = 0  # free checks in a row that missed
        self.idle = 0  # steps since the last check

    def landed(self, accepted: int) -> None:
        """A round that sent drafts kept ``accepted`` of them."""
        self.hot = accepted > 0
        self.streak = HIT_STREAK if self.hot else 0
        self.misses = self.idle = 0

    def checked(self, hit: bool) -> None:
        """A free check: the guess equalled the token sampled there (``hit``) or not."""
        self.streak = self.streak + 1 if hit else 0
        self.misses = 0 if hit else self.misses + 1
        self.hot = self.streak >= HIT_STREAK

    def due(self) -> bool:
        """Whether this step guesses at all (asked once a step): always while hot or
        while checks come true, else after the backoff's wait since the last check."""
        wait = min(2 ** self.misses - 1, self.backoff - 1)
        if self.hot or self.streak or self.idle >= wait:
            self.idle = 0
            return True
        self.idle += 1
        return False
