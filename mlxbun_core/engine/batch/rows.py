"""The batch's plain records: a row, a token handed out, and the shapes of the callbacks
the executor takes (forced runs, drafts, the MTP tap). Kept apart from the executor so
the window step (``windows.py``) reads them without importing the executor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import mlx.core as mx

    from .pool import BlockTable


@dataclass
class Emit:
    """A token handed out: row ``uid``'s ``token`` with its ``logprobs`` and the
    grammar-forced run fed after it (``forced``); ``finish`` is ``"length"`` when it
    used up the row's budget. The first token a row hands out in a step that carried
    its drafts says how many it fed (``drafted``) and kept (``accepted``)."""

    uid: int
    token: int
    logprobs: mx.array
    finish: str | None = None
    forced: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


Forcing = Callable[[list[int], list[int]], dict[int, list[int]]]
"""``forcing(uids, tokens)``: the grammar-forced run each row feeds after its next
input ``tokens[i]`` (sampled, about to be handed out, now read on the host)."""

Drafts = Mapping[int, "Sequence[int] | mx.array"]
"""A step's drafts by row: host tokens (prompt lookup) or a device array (an MTP
head's, never read on the host before the verify pass)."""


class Tap(Protocol):
    """What reads the target's hidden states for the rows added with ``tapped=True``."""

    def forward(self, inputs: mx.array, caches: list[Any]) -> tuple[mx.array, mx.array]:
        """The target's pass: logits and hidden states, ``(rows, width, ...)`` each."""
        ...

    def prompt(self, uids: list[int], hidden: mx.array, after: list[list[int]]) -> None:
        """A prefill pass read ``len(after[i])`` prompt tokens of row ``uids[i]``:
        ``hidden[i, j]`` is the state at the j-th, and ``after[i][j]`` the token after it."""
        ...

    def kept(self, uid: int, hidden: mx.array, fed: list[int]) -> None:
        """A decode step kept ``k`` positions of row ``uid``: their states ``hidden``
        ``(1, k, H)`` and the tokens ``fed`` there; the last state is followed by the
        row's next input (still on the device)."""
        ...

    def arrays(self) -> list[mx.array]:
        """Its own arrays to evaluate with a pass."""
        ...


@dataclass
class Row:
    uid: int
    table: BlockTable
    tokens: list[int]  # tokens whose KV is written, in order
    todo: list[int]  # prompt tokens not yet fed (the last one is the first decode input)
    sampler: Any
    processors: Sequence[Any]
    budget: int  # tokens it may still generate
    states: list[Any] = field(default_factory=list)  # recurrent state while not decoding
    context: mx.array | None = None  # what its logits processors see: every fed token
    tapped: bool = False  # its passes hand it the target's hidden states (Tap)
    # kept tokens a recurrent rollback took back out of its KV, fed again before its next
    # input (windows.py); already handed out
    refeed: list[int] = field(default_factory=list)
    # its first pass: ``first_cap`` tokens (0: as planned); what it kept, noted
    # under a KV scheme once a later pass begins (None: not yet; 0: it started holding
    # KV; see ``first_kept``)
    first_cap: int = 0
    first: int | None = None

    @property
    def first_kept(self) -> int:
        """Tokens its first pass kept when it started holding no KV (0: it started
        holding some, or has not run). Under a KV scheme those attended in full precision
        and all after them over quantized keys, as in mlx-lm's loop: the row recomputed
        from its tokens (``Batch.add(first=)``) reads as many first, and equals it."""
        return self.table.length if self.first is None else self.first

    def chunk(self, asked: int) -> int:
        """Prompt tokens it reads in a prefill pass that asks ``asked`` (all but its
        prompt's last at most); its first pass reads ``first_cap`` when bound, whatever
        was asked (what its first run read there, as exactly as the run can be replayed)."""
        if self.first_cap and not self.table.length:
            asked = self.first_cap
        return max(1, min(asked, len(self.todo) - 1))
