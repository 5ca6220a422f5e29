"""The memory governor: how much memory the KV may take, measured, and how the engine
tells memory it can win back from a device it cannot.

- **A measured budget.** Memory free now, read from where it is known
  (``readings.py``; CUDA: MLX's ``device_info()["free_memory"]``, which NVML fills
  with every process's use, and the driver pool's unused reserve; Metal:
  the GPU's recommended working set less what MLX holds, and the system's free memory
  from ``vm_stat``; the CPU backend: ``MemAvailable`` of ``/proc/meminfo``), plus the
  buffers MLX keeps cached (ours to give back), less a safety margin. Read at most once
  a second while the engine works and at once after an allocation failed, so the block
  pool shrinks its limit when another process takes memory and grows it again when
  that process leaves. ``--memory-budget`` (admission's plan) stays the ceiling.
- **Failures, classified.** An out-of-memory from MLX (``OOM``) is survived: the lane
  frees MLX's cache and the KV, preempts rows and runs them again later
  (``lanes/pressure.py``). A fault the device keeps (``DEVICE``: an illegal memory
  access, a launch failure; an out-of-memory that persists once everything was freed)
  ends the engine: :meth:`Governor.lost` tells the engine, which refuses work, says 503
  on ``/health`` and exits for a supervisor (or the ``--isolate`` parent) to restart it.
- **Fault injection, for tests.** ``MLXBUN_FAULT_ALLOC=N``: every N-th step's allocation
  fails as MLX's out-of-memory does; ``MLXBUN_FAULT_DEVICE=N``: step N fails as a sticky
  device fault, and every step after it. Read once, where the engine starts
  (:meth:`MemoryConfig.from_config`); a step is one pass of the batch, one step of the lone
  stream or of the serial lane.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..events import Retry
from ..runconfig import RunConfig, current
from .readings import Probe, Reading, measure

OOM, DEVICE = "oom", "device"
MEMORY_PRESSURE, DEVICE_FAULT = "memory_pressure", "device_fault"  # Retry codes
MEASURE_EVERY_S = 1.0  # a reading this old is taken again before the pool grows
MARGIN_MIN_BYTES = 512 << 20
MARGIN_FRACTION = 0.05  # of the device's memory: activations, MLX's scratch, the rest
MARGIN_MAX_BYTES = 2 << 30  # (an H100 under another tenant with 4.0 GB free served 4 of 32
# requests behind a 4.3 GB margin, all 32 with 8 GB free; an out-of-memory is survived)
DEFAULT_WAIT_S = 60.0
RETRY_DEFAULT_S, RETRY_MAX_S = 5, 30

# how MLX and the drivers under it word a failed allocation, and a fault that sticks
_OOM_WORDS = ("out of memory", "outofmemory", "insufficient memory", "memoryallocation",
              "unable to allocate", "failed to allocate", "[malloc]", "allocation failed")
_DEVICE_WORDS = ("illegal memory access", "illegal address", "illegal instruction",
                 "unspecified launch failure", "misaligned address", "device-side assert",
                 "ecc error", "uncorrectable", "gpu hang", "caused gpu timeout",
                 "command buffer execution failed", "device lost", "hardware exception")
INJECTED_OOM = ("[malloc] Unable to allocate the step's buffers: out of memory "
                "(injected by MLXBUN_FAULT_ALLOC)")
INJECTED_DEVICE = ("CUDA error: an illegal memory access was encountered "
                   "(injected by MLXBUN_FAULT_DEVICE)")


def classify(exc: BaseException) -> str | None:
    """``OOM`` for a failed allocation, ``DEVICE`` for a fault the device keeps, None for
    anything else (a bug: the lane's ordinary failure path)."""
    if not isinstance(exc, (RuntimeError, MemoryError)):
        return None
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or any(w in text for w in _OOM_WORDS):
        return OOM
    if any(w in text for w in _DEVICE_WORDS):
        return DEVICE
    return None


@dataclass(frozen=True)
class MemoryConfig:
    """How the engine meets memory pressure (``wait_s``: seconds a request may wait for
    memory before its 503; 0 waits for ever) and the test-only fault injection."""

    wait_s: float = DEFAULT_WAIT_S
    fault_alloc: int = 0  # every N-th step's allocation fails (MLXBUN_FAULT_ALLOC)
    fault_device: int = 0  # step N's device fault sticks (MLXBUN_FAULT_DEVICE)
    margin_bytes: int | None = None  # None: 5 % of the device's memory, 512 MiB to 2 GiB

    @classmethod
    def from_config(cls, config: RunConfig | None = None, **kw: Any) -> MemoryConfig:
        """The fault injection of ``config``, else of the installed run configuration."""
        faults = (config or current()).faults
        return cls(fault_alloc=faults.alloc, fault_device=faults.device, **kw)


def _clear_cache() -> None:
    import mlx.core as mx

    mx.clear_cache()


# -- the governor ------------------------------------------------------------------------
class Governor:
    """One engine's memory: the measured budget, the injected faults, what pressure did
    (``/stats`` and ``/metrics``) and whether the device is lost.

    ``probe`` reads free memory (tests hand in their own); ``on_lost(reason)`` is the
    engine's reaction to a device it cannot go on with (called on the worker thread)."""

    def __init__(self, config: MemoryConfig | None = None, probe: Probe | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config or MemoryConfig()
        self.probe = probe or measure  # how free memory is read (tests hand in theirs)
        self.give_back: Callable[[], None] = _clear_cache  # MLX's cache to the device
        self._clock = clock
        self._gave_back_at = -math.inf
        self.reading: Reading | None = None
        self._read_at = -math.inf
        # bytes the engine itself holds now (its KV pool; the lane sets it): what it
        # allocated since the last reading is taken off that reading
        self.held: Callable[[], int] = lambda: 0
        self._held_at_read = 0
        self.steps = 0  # steps counted for the fault injection
        self._sticky: str | None = None  # an injected device fault, raised from then on
        self.broken: str | None = None  # why the device cannot go on (None: it can)
        # rank 0 of a distributed serve: its passes run collectives with the other ranks
        self.lockstep = False
        self.on_lost: Callable[[str], None] | None = None
        self.restart_after = 10  # seconds a restart takes (the engine sets its load time)
        self._ends: collections.deque[float] = collections.deque(maxlen=16)
        self.counts = {"preemptions": 0, "retries": 0, "refused": 0, "out_of_memory": 0,
                       "out_of_blocks": 0, "injected": 0, "device_faults": 0,
                       "steps_trimmed": 0, "steps_over_room": 0, "cache_given_back": 0}
        # a step's temporaries beside the pool (lanes/stepfit.py): the room the pool's
        # growth keeps, the last planned step's estimate and room, the largest estimate
        self.step = {"reserve_bytes": 0, "bytes": 0, "room_bytes": 0, "peak_bytes": 0}

    # -- the budget ------------------------------------------------------------------
    @property
    def margin(self) -> int:
        if self.config.margin_bytes is not None:
            return self.config.margin_bytes
        total = self.reading.total if self.reading is not None else 0
        return min(MARGIN_MAX_BYTES, max(MARGIN_MIN_BYTES, int(total * MARGIN_FRACTION)))

    def available(self, fresh: bool = False) -> int:
        """Bytes the engine may still allocate (the margin kept back, and what the
        engine's pool grew by since the reading); read again when the last reading is
        older than a second, or at once with ``fresh``."""
        now = self._clock()
        if fresh or self.reading is None or now - self._read_at >= MEASURE_EVERY_S:
            try:
                self.reading = self.probe()
            except Exception:  # a failed reading keeps the last one (or no limit)
                if self.reading is None:
                    self.reading = Reading(1 << 62, 0, "unknown")
            self._read_at = now
            self._held_at_read = self.held()
        grown = max(0, self.held() - self._held_at_read)
        return max(0, self.reading.available - self.margin - grown)

    def room(self, want: int) -> int:
        """:meth:`available`; when that is less than ``want``, MLX's cache goes back to
        the device first and memory is read again (:meth:`reclaim`), so nothing is
        preempted, trimmed or kept waiting for memory only MLX's allocator was keeping:
        its cache, and on CUDA what the driver's pool holds of buffers freed without a
        sync."""
        got = self.available()
        return self.available() if got < want and self.reclaim() else got

    def reclaim(self) -> bool:
        """MLX's cache back to the device and a fresh reading (False: done less than a
        second ago, nothing changed)."""
        now = self._clock()
        if now - self._gave_back_at < MEASURE_EVERY_S:
            return False
        self._gave_back_at = now
        self.give_back()
        self.counts["cache_given_back"] += 1
        self.available(fresh=True)
        return True

    def pool_limit(self, planned: int, capacity: int, bytes_per_block: int,
                   fresh: bool = False, reserve: int = 0, freed: int = 0) -> int:
        """The blocks a pool of ``capacity`` blocks (``bytes_per_block`` each) may grow
        to: ``planned`` (admission's budget) and what fits in the memory free now less
        ``reserve`` (a step's temporaries). The new storage is allocated while the old is
        copied into it; ``freed`` is what of the old the copy gives back as it goes (the
        layout grows a layer at a time), so the new size must fit in free memory and
        that. (Without it, the pool could never take more than half the memory free
        beside it.) A pool never shrinks below what it holds."""
        if bytes_per_block <= 0:
            return max(planned, capacity)
        room = max(0, self.available(fresh) - reserve + freed)
        return max(capacity, min(planned, room // bytes_per_block))

    def planned(self, estimate: int, room: int, trimmed: bool) -> None:
        """A step was planned: its temporaries' ``estimate`` against the ``room`` free
        for them (``trimmed``: cut to fit)."""
        step = self.step
        step["bytes"], step["room_bytes"] = estimate, room
        step["peak_bytes"] = max(step["peak_bytes"], estimate)
        self.counts["steps_trimmed"] += trimmed
        self.counts["steps_over_room"] += estimate > room

    # -- faults ----------------------------------------------------------------------
    def inject(self) -> None:
        """A step's allocation point: raise the injected fault due here, if any."""
        if self._sticky is not None:
            raise RuntimeError(self._sticky)
        c = self.config
        if not (c.fault_alloc or c.fault_device):
            return
        self.steps += 1
        if c.fault_device and self.steps >= c.fault_device:
            self._sticky = INJECTED_DEVICE
            raise RuntimeError(self._sticky)
        if c.fault_alloc and self.steps % c.fault_alloc == 0:
            self.counts["injected"] += 1
            raise RuntimeError(INJECTED_OOM)

    def failed(self) -> None:
        """A step failed for memory (the lane runs it again)."""
        self.counts["retries"] += 1

    def lost(self, reason: str) -> None:
        """The device cannot go on: remember why and tell the engine (once)."""
        if self.broken is not None:
            return
        self.broken = reason
        self.counts["device_faults"] += 1
        if self.on_lost is not None:
            self.on_lost(reason)

    # -- answers ---------------------------------------------------------------------
    def classify(self, exc: BaseException) -> str | None:
        """:func:`classify` for this engine. Under ``lockstep`` an out-of-memory is a lost
        device too: a pass that failed may have run some of its collectives and not the
        rest, and the other ranks, waiting in one or pairing it with the next pass's,
        would go apart from rank 0; only a restart of every rank puts them back in step."""
        kind = classify(exc)
        return DEVICE if kind == OOM and self.lockstep else kind

    def fault_reason(self, exc: BaseException) -> str:
        """Why ``exc`` (classified ``DEVICE`` by :meth:`classify`) ends the engine."""
        if self.lockstep and classify(exc) == OOM:
            return f"out of memory under --distributed, every rank restarts: {exc}"
        return str(exc)

    def refusal(self, kind: str, exc: BaseException) -> tuple[str, Retry]:
        """What a job that ``exc`` (classified ``kind``) ended is told: a device fault
        ends the engine (:meth:`lost`); an out-of-memory is a 503 to send again."""
        if kind == DEVICE:
            self.lost(self.fault_reason(exc))
            return (f"the device failed ({exc}); the engine is restarting",
                    Retry(self.restart_after, DEVICE_FAULT))
        self.counts["out_of_memory"] += 1
        self.counts["refused"] += 1
        retry = Retry(self.retry_after(), MEMORY_PRESSURE)
        return f"out of memory ({exc}); retry after {retry.after} s", retry

    def row_ended(self) -> None:
        """A running request ended (its memory is free again): paces ``retry_after``."""
        self._ends.append(self._clock())

    def retry_after(self) -> int:
        """Seconds after which memory is likely free again: the recent gap between
        requests ending (or the time since the last, when longer), within 1-30 s."""
        ends = self._ends
        if not ends:
            return RETRY_DEFAULT_S
        since = self._clock() - ends[-1]
        gap = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else since
        return max(1, min(RETRY_MAX_S, math.ceil(max(gap, since))))

    def stats(self) -> dict[str, Any]:
        r = self.reading
        c = self.config
        return {"available_bytes": max(0, r.available - self.margin) if r is not None else None,
                "free_bytes": r.available if r is not None else None,
                "margin_bytes": self.margin, "source": r.source if r is not None else None,
                "wait_s": c.wait_s, "device": "lost" if self.broken else "ok",
                "device_fault": self.broken, **self.counts,
                **{f"step_{k}": v for k, v in self.step.items()},
                "fault_injection": {"alloc_every": c.fault_alloc or None,
                                    "device_at": c.fault_device or None}}
