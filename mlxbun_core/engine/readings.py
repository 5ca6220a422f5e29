"""Free memory, read where each backend knows it (``memory.py``'s governor turns a
reading into a budget): CUDA's free memory, MLX's cache and the driver pool's unused
reserve within MLX's limit; Metal's working set and ``vm_stat``; ``/proc/meminfo``."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reading:
    """Bytes this process could still allocate (before the margin), the device's memory
    (the margin is a share of it) and where the figure came from."""

    available: int
    total: int
    source: str


Probe = Callable[[], Reading]


def parse_meminfo(text: str) -> int | None:
    """``MemAvailable`` of a ``/proc/meminfo`` text, in bytes (None: not there)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * (1024 if parts[-1].lower() == "kb" else 1)
    return None


def parse_vm_stat(text: str) -> int | None:
    """Free memory from macOS's ``vm_stat``: free, inactive, speculative and purgeable
    pages (what the system gives back without swapping), in bytes."""
    page = 4096
    pages = 0
    seen = False
    for line in text.splitlines():
        if "page size of" in line:
            page = int(line.split("page size of")[1].split()[0])
            continue
        name, _, value = line.partition(":")
        if name.strip() in ("Pages free", "Pages inactive", "Pages speculative",
                            "Pages purgeable"):
            pages += int(value.strip().rstrip("."))
            seen = True
    return pages * page if seen else None


def cuda_reading(info: Mapping[str, Any], cached: int, active: int, limit: int,
                 slack: int = 0) -> Reading:
    """CUDA: the device's free memory (every process's use seen), MLX's cache and the
    ``slack`` the driver's memory pool keeps for us (``cuda_pool.py``), never more than
    MLX's own limit less what it holds; without ``free_memory`` (an older MLX), that
    limit alone.

    The ceiling matters twice. Past its limit MLX's allocator does not fail: it empties
    its cache on every allocation and then takes managed memory that oversubscribes the
    device (slow steps, and a device nearly full). And MLX caches freed buffers whatever
    it holds, so its cache can outgrow what the device has beside the active memory:
    free memory then reads zero while the whole cache still reads as room."""
    free = info.get("free_memory")
    total = int(info.get("total_memory") or info.get("memory_size") or limit or 0)
    ceiling = max(0, limit - active) if limit > 0 else None
    if free is None:
        return Reading(ceiling or 0, total, "MLX memory limit (no free-memory reading)")
    room = int(free) + cached + slack
    if ceiling is not None and ceiling < room:
        return Reading(ceiling, total, "CUDA free memory, within MLX's memory limit")
    return Reading(room, total, "CUDA free memory")


def metal_reading(info: Mapping[str, Any], cached: int, active: int,
                  system_free: int | None) -> Reading:
    """Metal: the recommended working set less what MLX holds, and the system's free
    memory (unified memory: other processes take from the same RAM)."""
    total = int(info.get("memory_size") or 0)
    working = int(info.get("max_recommended_working_set_size") or total)
    gpu = max(0, working - active)
    if system_free is None:
        return Reading(gpu, total, "Metal working set")
    return Reading(min(gpu, system_free + cached), total, "Metal working set and vm_stat")


def measure() -> Reading:
    """What this process could still allocate, on the backend MLX runs on. On CUDA it
    also moves MLX's memory and cache limits to follow the reading (``follow_limit``,
    ``follow_cache``): every reading the budget takes steers the allocator, by design."""
    import mlx.core as mx

    cached, active = int(mx.get_cache_memory()), int(mx.get_active_memory())
    info = mx.device_info()
    if mx.default_device() == mx.gpu:
        cuda = getattr(mx, "cuda", None)
        if cuda is not None and cuda.is_available():
            from .cuda_pool import pool_slack

            limit = _started_limit()
            reading = cuda_reading(info, cached, active, limit, pool_slack() or 0)
            mx.set_memory_limit(follow_limit(reading, active, limit))
            mx.set_cache_limit(follow_cache(int(info.get("free_memory") or limit), cached,
                                            reading.total or limit))
            return reading
        return metal_reading(info, cached, active, _system_free())
    free = _system_free()
    total = _ram()
    if free is None:  # no reading: what MLX would allow
        return Reading(max(0, int(mx.get_memory_limit()) - active), total, "MLX memory limit")
    return Reading(free + cached, total, "system available memory")


def follow_limit(reading: Reading, active: int, started: int) -> int:
    """MLX's memory limit on CUDA, following the device: what MLX holds and what the
    reading says it may still take, never past the limit MLX started with.

    MLX's allocator gives cached buffers back only when its active memory, its cache and
    the new buffer pass its limit. With the limit at the device's total and another
    process holding most of the device, it kept gigabytes of buffers of the wrong sizes
    cached and asked the driver for more, which failed (an H100 under another tenant:
    five failed ``cudaMallocAsync`` in two seconds, then a failed graph instantiation,
    then an illegal memory access that ended the engine). At this limit it drops cached
    buffers first, and a new one is asked of the driver only where it fits. With the
    device to itself the limit stays where it started."""
    return max(active, min(started, active + reading.available))


CACHE_KEEP_FRACTION = 0.05  # of the device: left free for others by MLX's cache
CACHE_FLOOR = 1 << 30  # MLX keeps this much cached however tight the device


def follow_cache(free: int, cached: int, total: int) -> int:
    """MLX's cache limit on CUDA: its cache may grow while the device keeps a twentieth
    free, and no further; never below a gigabyte (a step's buffers to reuse).

    Buffers whose sizes change with every step (a growing sequence's) fill MLX's cache
    with sizes no later step asks for: one 32-row load on an H100 left 52 GiB cached and
    7 GiB of the device free. MLX counts its cache as its own room, but a second server
    on the card sees only the free memory. At this limit MLX gives the excess back as it
    next allocates, and with the device to itself nothing changes until it is nearly
    full."""
    keep = int(total * CACHE_KEEP_FRACTION)
    return max(CACHE_FLOOR, cached + free - keep)


@functools.cache
def _started_limit() -> int:
    """MLX's memory limit as the process started (before :func:`follow_limit` moved it)."""
    import mlx.core as mx

    return int(mx.get_memory_limit())


def _system_free() -> int | None:
    try:
        if sys.platform == "darwin":
            out = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=2)
            return parse_vm_stat(out.stdout)
        with open("/proc/meminfo", encoding="ascii") as f:
            return parse_meminfo(f.read())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
