"""Hub search (``GET /api/hub/search``): MLX-ready repos only, never a download.

"MLX-ready" is the hub's own ``mlx`` library tag (what mlx-lm's converter and
mlx-community uploads carry), so every result loads here without a conversion.
Any network failure is an explicit offline answer, never a 500.
"""

from __future__ import annotations

from typing import Any

from . import remote

MLX_FILTER = "mlx"
MAX_RESULTS = 50


def search(query: str, limit: int = 20) -> dict[str, Any]:
    """``{ok, offline, results: [{id, downloads, likes, size_estimate}]}`` (+ ``error``)."""
    limit = max(1, min(MAX_RESULTS, limit))
    if remote.offline():
        return {"ok": True, "offline": True, "results": [],
                "error": remote.explain(RuntimeError("offline"))}
    from ..models.resolve import hub_unreachable

    why = hub_unreachable(remote.endpoint())  # fail in milliseconds, not after retries
    if why is not None:
        return {"ok": True, "offline": True, "results": [],
                "error": f"offline: the hub {remote.endpoint()} cannot be reached ({why})"}
    try:
        found = list(remote.api().list_models(search=query, filter=MLX_FILTER,
                                              sort="downloads", limit=limit))
    except Exception as exc:  # DNS, refused, timeout, a hub 5xx: all mean "not now"
        return {"ok": True, "offline": True, "results": [], "error": remote.explain(exc)}
    rows = [{"id": m.id, "downloads": m.downloads or 0, "likes": m.likes or 0,
             "gated": bool(getattr(m, "gated", False)), "size_estimate": None} for m in found]
    return {"ok": True, "offline": False, "results": rows}
