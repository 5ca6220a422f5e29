"""``POST /admin/cache/flush`` (the SSD tier's durability boundary) and ``/stats.ssd_cache``.

An admin route: the guard answers it for loopback clients only unless an API key is
set. 200 when every prompt-cache entry is on disk (atomic temp file, fsync, rename);
503 with the counters that say why not (a write failed or was dropped, or an entry
is still pending at the timeout). Without ``--ssd-cache`` it answers 200 with
``enabled: false`` (nothing to flush, nothing durable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..errors import BadRequest
from ..kvstore import durability
from .body import _read_capped, max_body_bytes, parse_body
from .common import guarded, json_response

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App

MAX_TIMEOUT_S = 3600.0


async def _timeout(request: Request) -> float:
    """The optional body's ``timeout_s`` (no body: the default)."""
    raw = await _read_capped(request, max_body_bytes())
    if not raw.strip():
        return durability.DEFAULT_TIMEOUT_S
    value = parse_body(raw).get("timeout_s", durability.DEFAULT_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_TIMEOUT_S:
        raise BadRequest(f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]",
                         param="timeout_s")
    return float(value)


def register(app: App, engine: Engine) -> None:
    @guarded()
    async def flush(request: Request) -> Response:
        report = await durability.flush(engine, await _timeout(request))
        ok = report["durable"] or not report["enabled"]
        return json_response(report, 200 if ok else 503)

    app.router.add_post("/admin/cache/flush", flush)
    tier = engine.prefix.tier
    if tier is not None:
        def ssd_stats() -> dict[str, Any]:
            return {**tier.stats(), "pending_snapshots": engine.prefix.dirty()}

        app.state.stats_providers["ssd_cache"] = ssd_stats
    checkpoints = getattr(engine, "checkpoints", None)
    if checkpoints is not None:  # --generation-checkpoint
        app.state.stats_providers["generation_checkpoint"] = checkpoints.stats
