"""Memory the CUDA driver keeps for this process without it being in use.

MLX allocates on CUDA with ``cudaMallocAsync`` from the device's default memory pool
and gives buffers back with ``cudaFreeAsync``. A buffer so freed goes back to that
pool, not to the device: the pool keeps it reserved until a later synchronisation
trims it. Until then the device's free memory (NVML, ``cudaMemGetInfo``) does not
count it, and neither does MLX's cache, yet the next ``cudaMallocAsync`` reuses it.
Under churn (a batch whose step shapes change every step) that slack reached tens of
gigabytes on an H100, read as memory gone. :func:`pool_slack` reads it through the
CUDA driver's public API (``cuMemPoolGetAttribute``: reserved less used), so the
governor counts it as room; None where there is no CUDA driver.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

RESERVED_MEM_CURRENT, USED_MEM_CURRENT = 5, 7  # CUmemPool_attribute


@functools.cache
def _driver() -> tuple[Any, ctypes.c_void_p] | None:
    """libcuda and device 0's default memory pool (None: no driver, no pool)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    pool, device = ctypes.c_void_p(), ctypes.c_int()
    try:
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
            return None
        if cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device) != 0:
            return None
    except AttributeError:  # a driver older than memory pools
        return None
    return cuda, pool


def pool_slack() -> int | None:
    """Bytes device 0's default pool holds reserved but unused (None: unknown)."""
    got = _driver()
    if got is None:
        return None
    cuda, pool = got
    reserved, used = ctypes.c_uint64(), ctypes.c_uint64()
    if cuda.cuMemPoolGetAttribute(pool, RESERVED_MEM_CURRENT, ctypes.byref(reserved)) != 0 \
            or cuda.cuMemPoolGetAttribute(pool, USED_MEM_CURRENT, ctypes.byref(used)) != 0:
        return None
    return max(0, reserved.value - used.value)
