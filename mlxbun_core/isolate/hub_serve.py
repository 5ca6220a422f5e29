"""``POST /api/hub/serve`` under ``--isolate --model-pool N``: add a model to the pool.

The isolation parent owns the pool, so it answers this route itself (the engine child
behind it can only say "restart"): a local model that ``/v1/models`` lists is started
in its own engine now (the least recently used idle one drains if the pool is full),
so the next request naming it finds it warm. With a pool of one, or a model the
library does not hold, the request goes on to the engine, which answers
``restart_required`` with the command to run.

The parent's library scan is cached (30 s), and the model to serve is often one that
did not exist at the last scan: the lab's quantize job (in the engine child's process)
just wrote it. So a name the cached scan lacks rescans the library once before the
request is handed on.
"""

from __future__ import annotations

from typing import Any

from ..library.cache import LibraryCache
from .pool import EnginePool, ModelSpec, background


def wanted(pool: EnginePool, body: dict[str, Any]) -> ModelSpec | None:
    """The pool spec ``body["model"]`` names, or None (let the engine answer)."""
    model = body.get("model")
    if pool.cap < 2 or not isinstance(model, str) or not model:
        return None
    spec = pool.target(model)
    return spec if spec.id == model else None


async def wanted_fresh(pool: EnginePool, library: LibraryCache,
                       body: dict[str, Any]) -> ModelSpec | None:
    """:func:`wanted`, rescanning the library once when the cached scan lacks the model
    (one written since, e.g. by a quantize job)."""
    spec = wanted(pool, body)
    if spec is None and pool.cap >= 2 and isinstance(body.get("model"), str):
        await library.aentries(refresh=True)
        spec = wanted(pool, body)
    return spec


async def _warm(pool: EnginePool, spec: ModelSpec) -> None:
    async with pool.lease(spec):
        pass


def serve(pool: EnginePool, spec: ModelSpec) -> dict[str, Any]:
    """Start ``spec``'s engine in the background; report where it stands now."""
    engine = pool.engines.get(spec.id)
    state = engine.state if engine is not None else "starting"
    if engine is None or state in ("stopping", "stopped"):
        background(_warm(pool, spec))
        state = "starting"
    return {"ok": True, "pool": True, "model": spec.id, "state": state,
            "resident": [e for e in pool.engines if e != spec.id] + [spec.id]}
