"""The split-key kernel's setting to serve, from ``paged_kernel.py --sweep``'s JSON: the
fastest at 32 rows x 640 keys (the 32-client decode step) among the settings whose output
matched the shipped setting's on every shape (``diff_from_default``) and whose
keys-per-warp-step, load-width and combine setting matched the reference; printed as
``engine_ab.py``'s ``paged@...`` setting (``CHUNK=..,WARPS=..,GROUP=..,VEC=..,FUSED=..``).

    python bench/sweep_best.py kernel_sweep.json
"""
from __future__ import annotations

import json
import re
import sys

SHAPE = "rows32_len640"


def setting(name: str) -> str:
    m = re.fullmatch(r"splitk_c(\d+)_w(\d+)_g(\d+)(_vec)?(_fused)?_us", name)
    assert m, name
    return (f"CHUNK={m[1]},WARPS={m[2]},GROUP={m[3]},VEC={int(bool(m[4]))},"
            f"FUSED={int(bool(m[5]))}")


def best(sweep: dict, shape: str = SHAPE) -> str:
    """The fastest setting at ``shape`` that is right everywhere."""
    errors, shapes = sweep["errors"], [v for k, v in sweep.items() if k.startswith("rows")]
    worst_shipped = errors.get("g1", 0.0)

    def right(name: str) -> bool:
        m = re.fullmatch(r"splitk_c\d+_w\d+_(g\d+(?:_vec)?(?:_fused)?)_us", name)
        ok_ref = m is not None and errors.get(m[1], 1e9) <= max(2 * worst_shipped, 0.02)
        return ok_ref and all(s["diff_from_default"].get(name, 1e9) <= s["diff_tolerance"]
                              for s in shapes)

    times = sweep[shape]
    return min((t, k) for k, t in times.items() if k.startswith("splitk") and right(k))[1]


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(setting(best(json.load(f)["sweep"])))
