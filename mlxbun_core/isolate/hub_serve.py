"""``POST /api/hub/serve`` under ``--isolate --model-pool N``: add a model to the pool.

The isolation parent owns the pool, so it answers this route itself (the engine child
behind it can only say "restart"): a local model that ``/v1/models`` lists is started
in its own engine now (the least recently used idle one drains if the pool is full),
so the next request naming it finds it warm. With a pool of one, or a model the
library does not hold, the request goes on to the engine, which answers
``restart_required`` with the command to run.
"""

from __future__ import annotations

from typing import Any

from .pool import EnginePool, ModelSpec, background


def wanted(pool: EnginePool, body: dict[str, Any]) -> ModelSpec | None:
    """The pool spec ``body["model"]`` names, or None (let the engine answer)."""
    model = body.get("model")
    if pool.cap < 2 or not isinstance(model, str) or not model:
        return None
    spec = pool.target(model)
    return spec if spec.id == model else None


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
