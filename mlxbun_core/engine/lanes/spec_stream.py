"""Which prompt-lookup stream a job's speculation runs on: guided (fill what is forced,
draft what is free) when the request also fills, else plain."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..speculate import GuidedStream, SpecStream

if TYPE_CHECKING:
    from ..job import GenerationJob


def spec_stream(job: GenerationJob, model: Any, cache: list[Any], fed: list[int]
                ) -> SpecStream:
    """``job``'s prompt-lookup stream over ``cache`` (holding ``fed``): guided when its
    request fills too. Its ``usage.speculation`` must be set."""
    req, spec, usage = job.request, job.spec, job.session.usage.speculation
    assert spec is not None and req.sampler is not None and usage is not None  # (callers)
    if job.fill is not None:
        return GuidedStream(model, cache, fed, spec, req.sampler, req.processors, usage,
                            job.spec_tally, fill=job.fill)
    return SpecStream(model, cache, fed, spec, req.sampler, req.processors, usage,
                      job.spec_tally)
