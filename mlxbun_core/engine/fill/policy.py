"""Whether forced-token fill runs, for which requests, and the server-wide counters.

``MLXBUN_FILL`` (or ``serve --fill``): ``off`` (default) or ``strict``. Under ``strict``
a constrained request whose grammar allows exactly one next token appends that token
(and the run of single-choice tokens after it) to the next forward pass instead of
sampling it one step at a time. ``echo`` (the reference's session-copy tier) is not
built; it is read as ``strict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...env_readers import DEFAULT_FILL_MAX_SPAN, parse_fill
from ...runconfig import current

if TYPE_CHECKING:
    from ..job import GenerationJob
    from .forced import FillSession

MODES = ("off", "strict")
DEFAULT_MAX_SPAN = DEFAULT_FILL_MAX_SPAN
parse_mode = parse_fill  # ``off``/``strict`` from a flag or env value


@dataclass
class FillPolicy:
    """The engine's fill setting and its ``/stats`` counters (updated on the worker)."""

    mode: str = "off"
    max_span: int = DEFAULT_MAX_SPAN
    requests: int = 0      # requests that ran with a fill session
    events: int = 0        # forced runs appended to a forward pass
    injected: int = 0      # tokens those runs carried
    refused: dict[str, int] = field(default_factory=dict)  # constrained but ineligible, why

    @classmethod
    def resolve(cls, mode: str | None = None) -> FillPolicy:
        """``mode`` from the flag, else the run configuration's (``MLXBUN_FILL``)."""
        engine = current().engine
        return cls(parse_mode(mode) if mode is not None else engine.fill, engine.fill_max_span)

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def open(self, job: GenerationJob) -> FillSession | None:
        """A fill session for ``job``, or None (fill off, no grammar, or a shape that
        cannot skip its sampler: logprobs, a seed, a draft, media, embeddings)."""
        req = job.request
        if not self.on or req.grammar is None:
            return None
        why = refusal(job)
        if why is not None:
            self.refused[why] = self.refused.get(why, 0) + 1
            return None
        from .forced import FillSession

        self.requests += 1
        return FillSession(self, req.grammar, job.session.usage, job.limit)

    def stats(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_span": self.max_span, "requests": self.requests,
                "events": self.events, "injected": self.injected,
                "refused": dict(self.refused)}


def refusal(job: GenerationJob) -> str | None:
    """Why ``job`` must sample every token (None: it may fill)."""
    req = job.request
    if req.sampling.wants_logprobs:
        return "logprobs"  # every position needs its own distribution
    if req.sampling.seed is not None:
        return "seed"  # a skipped draw would shift the seeded random stream
    if job.draft is not None:
        return "draft"
    if req.media is not None or req.input_embeddings is not None:
        return "media"
    if not hasattr(req.grammar, "matcher"):
        return "grammar"
    return None
