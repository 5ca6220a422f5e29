"""The decode bandwidth ``fit`` predicts with: measured once per backend, then remembered.

A decode step streams every active weight once through matrix-vector products, so the
rate that matters is the one those products reach on this machine's MLX backend, not
the memory's peak (a CPU with the reference BLAS reaches a tenth of it). The
micro-benchmark times float32 (CPU) or float16 (GPU) matrix-vector products over more
weight bytes than any cache holds, through MLX itself; the result is kept in
``<home>/machine.json`` keyed by device, MLX version and BLAS, so ``mlxbun ls`` and
``fit`` give the same numbers run after run. ``MLXBUN_BANDWIDTH_GBS`` (taken as the
effective decode bandwidth) overrides it; a process that never imports MLX (the
``--isolate`` parent) uses a remembered measurement, else the peak table times
:data:`TABLE_EFFICIENCY`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..models.paths import mlxbun_home
from ..runconfig import current

log = logging.getLogger("mlxbun.fit")

TABLE_EFFICIENCY = 0.8  # share of a table's peak bandwidth a decode step achieves
CACHE_FILE = "machine.json"
HIDDEN = 1024  # the benchmark's MLP width: (4096, 1024) matrices, 16 MiB in float32
CPU_BYTES, GPU_BYTES = 256 << 20, 512 << 20  # streamed per pass: past every cache level

# Peak memory bandwidth (GB/s) by device-name pattern; first match wins.
PEAK_GBS = (
    (r"M\d Ultra", 800.0), (r"M4 Max", 546.0), (r"M\d Max", 400.0), (r"M4 Pro", 273.0),
    (r"M3 Pro", 150.0), (r"M\d Pro", 200.0), (r"M4\b", 120.0), (r"M[23]\b", 100.0),
    (r"M1\b", 68.0), (r"B200", 8000.0), (r"H200", 4800.0), (r"H100 PCIe", 2000.0),
    (r"H100", 3350.0), (r"A100", 2039.0), (r"L40S", 864.0), (r"RTX 5090", 1792.0),
    (r"RTX 4090", 1008.0), (r"RTX 3090", 936.0), (r"A10\b", 600.0), (r"L4\b", 300.0),
)


@dataclass(frozen=True)
class Bandwidth:
    gbs: float  # effective GB/s a decode step streams weights at (0: unknown)
    source: str  # "measured", "env", "table" or "unknown"
    note: str  # what was assumed, in words


def peak_gbs(name: str) -> float | None:
    for pattern, gbs in PEAK_GBS:
        if re.search(pattern, name):
            return gbs
    return None


def _key(device: str, name: str) -> str:
    import mlx.core as mx

    from .. import blas

    version = mx.__version__  # type: ignore[attr-defined]  # not in MLX's stubs
    return f"{device}|{name}|mlx {version}|blas {blas.state().name}"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def measure_gbs(gpu: bool) -> float:
    """GB/s of decode-shaped matrix-vector products through MLX now: ``x @ W.T`` over an
    MLP's two orientations (``(4h, h)`` up/gate, ``(h, 4h)`` down), as a decode step does."""
    import mlx.core as mx
    import numpy as np

    dtype = mx.float16 if gpu else mx.float32
    h = HIDDEN
    shapes = ((4 * h, h), (h, 4 * h))
    base = [mx.array(np.full(s, 0.5, dtype=np.float32)).astype(dtype) for s in shapes]
    count = max(2, (GPU_BYTES if gpu else CPU_BYTES) // base[0].nbytes)
    weights = [base[i % 2] + i for i in range(count)]  # distinct buffers, all materialized
    xs = [mx.array(np.full((1, s[1]), 0.25, dtype=np.float32)).astype(dtype) for s in shapes]
    mx.eval(weights, xs)
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        mx.eval([xs[i % 2] @ w.T for i, w in enumerate(weights)])
        best = min(best, time.perf_counter() - t0)
    total = sum(w.nbytes for w in weights)
    del weights, base, xs
    mx.clear_cache()  # give the benchmark's buffers back before a model needs the memory
    return round(total / best / 1e9, 2)


def decode_bandwidth(device: str, name: str, *, probe_mlx: bool,
                     home: Path | None = None) -> Bandwidth:
    """The bandwidth behind ``fit``'s decode prediction, and what it assumed."""
    gbs = current().models.bandwidth_gbs  # (a value that is no number was warned about)
    if gbs is not None:
        return Bandwidth(gbs, "env", f"{gbs} GB/s from MLXBUN_BANDWIDTH_GBS")
    path = mlxbun_home(home) / CACHE_FILE
    cache = _read(path)
    if probe_mlx:
        key = _key(device, name)
        hit = cache.get(key)
        if not (isinstance(hit, dict) and isinstance(hit.get("gbs"), (int, float))):
            hit = {"gbs": measure_gbs(device == "gpu"), "measured_at": time.strftime("%Y-%m-%d")}
            _store(path, {**cache, key: hit})
        return Bandwidth(hit["gbs"], "measured", _note(key, hit, device))
    remembered = [v for k, v in cache.items() if k.split("|")[0] == device
                  and isinstance(v, dict) and isinstance(v.get("gbs"), (int, float))]
    if remembered:
        return Bandwidth(remembered[-1]["gbs"], "measured",
                         "remembered from an earlier measurement")
    peak = peak_gbs(name)
    if peak:
        gbs = round(peak * TABLE_EFFICIENCY, 1)
        return Bandwidth(gbs, "table", f"{TABLE_EFFICIENCY:.0%} of {name}'s {peak} GB/s peak")
    return Bandwidth(0.0, "unknown", "no measurement yet (the engine measures on first load)")


def forget(home: Path | None = None) -> None:
    """Drop the remembered measurements (``mlxbun fit --measure``): the next use measures."""
    (mlxbun_home(home) / CACHE_FILE).unlink(missing_ok=True)


def _note(key: str, hit: dict, device: str) -> str:
    blas = key.split("|blas ", 1)[-1]
    what = "float16 matrix-vector products on the GPU" if device == "gpu" else \
        f"float32 matrix-vector products on the CPU, BLAS {blas}"
    return f"measured through MLX ({what}) on {hit.get('measured_at', '?')}"


def _store(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home measures again next time
        log.debug("could not remember the bandwidth in %s: %s", path, exc)
