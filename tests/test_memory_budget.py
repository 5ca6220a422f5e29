"""The memory governor (``engine/memory.py``): free memory read where each backend knows
it, a pool limit that follows the reading (down when another process takes memory, up
when it leaves), failures told apart, and the test-only fault injection."""

from __future__ import annotations

import pytest

from mlxbun_core.engine.batch import BlockPool
from mlxbun_core.engine.memory import DEVICE, OOM, Governor, MemoryConfig, classify
from mlxbun_core.engine.readings import (
    Reading,
    cuda_reading,
    follow_limit,
    measure,
    metal_reading,
    parse_meminfo,
    parse_vm_stat,
)
from mlxbun_core.runconfig import from_environ

MEMINFO = """MemTotal:       32797728 kB
MemFree:         1203448 kB
MemAvailable:   21307656 kB
Buffers:          311672 kB
"""

VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                               12000.
Pages active:                            400000.
Pages inactive:                          300000.
Pages speculative:                         5000.
Pages throttled:                              0.
Pages wired down:                        200000.
Pages purgeable:                           3000.
"""


class Meter:
    """A free-memory reading the test turns, and a clock it moves."""

    def __init__(self, available: int):
        self.available, self.now, self.reads = available, 100.0, 0

    def probe(self) -> Reading:
        self.reads += 1
        return Reading(self.available, 0, "test")

    def clock(self) -> float:
        return self.now


def test_readings_parse_each_backends_source():
    assert parse_meminfo(MEMINFO) == 21307656 * 1024
    assert parse_meminfo("MemTotal: 1 kB\n") is None
    assert parse_vm_stat(VM_STAT) == (12000 + 300000 + 5000 + 3000) * 16384
    # CUDA: NVML's free memory (every process's use) plus what MLX keeps cached for reuse
    got = cuda_reading({"free_memory": 7 << 30, "total_memory": 80 << 30}, cached=1 << 30,
                       active=50 << 30, limit=64 << 30)
    assert (got.available, got.total) == (8 << 30, 80 << 30)
    # free memory reads zero once MLX's cache outgrew the device: never past MLX's limit
    got = cuda_reading({"free_memory": 0, "total_memory": 80 << 30}, cached=30 << 30,
                       active=60 << 30, limit=64 << 30)
    assert got.available == 4 << 30 and "MLX's memory limit" in got.source
    # an MLX without free_memory: its own limit less what it holds
    assert cuda_reading({}, 0, active=50 << 30, limit=64 << 30).available == 14 << 30
    # Metal: the working set less MLX's active memory, and the system's free memory
    info = {"memory_size": 64 << 30, "max_recommended_working_set_size": 48 << 30}
    assert metal_reading(info, cached=0, active=40 << 30, system_free=20 << 30).available \
        == 8 << 30
    assert metal_reading(info, cached=1 << 30, active=10 << 30,
                         system_free=2 << 30).available == 3 << 30


def test_this_machine_is_measured():
    got = measure()
    assert got.available > 0 and got.total > 0 and got.source


def test_the_pool_limit_follows_a_shrinking_and_growing_reading():
    """Another process takes memory: the next reading (a second later, or at once after
    a failed allocation) lowers the pool's limit; it leaves: the limit grows back. The
    limit never drops below what the pool holds, and admission's plan stays the ceiling."""
    meter = Meter(1000 * 4096)
    gov = Governor(MemoryConfig(margin_bytes=100 * 4096), meter.probe, meter.clock)
    pool = BlockPool(16, 64, limit=10_000)
    planned = 10_000
    assert gov.pool_limit(planned, pool.capacity, 4096) == 900
    meter.available = 300 * 4096  # someone took most of it
    assert gov.pool_limit(planned, pool.capacity, 4096) == 900  # read under a second ago
    meter.now += 1.0
    assert gov.pool_limit(planned, pool.capacity, 4096) == 200  # the next reading
    meter.available = 150 * 4096
    assert gov.pool_limit(planned, pool.capacity, 4096, fresh=True) == 64  # what it holds
    assert gov.available() == 50 * 4096
    meter.available, meter.now = 5000 * 4096, meter.now + 1.0  # it left
    assert gov.pool_limit(planned, pool.capacity, 4096) == 4900
    assert gov.pool_limit(1000, pool.capacity, 4096) == 1000  # the plan is the ceiling
    assert gov.stats()["available_bytes"] == 4900 * 4096


def test_a_failed_reading_keeps_the_last_one():
    meter = Meter(1 << 30)
    gov = Governor(MemoryConfig(margin_bytes=0), meter.probe, meter.clock)
    assert gov.available() == 1 << 30

    def broken() -> Reading:
        raise OSError("no /proc here")

    gov.probe = broken
    assert gov.available(fresh=True) == 1 << 30


@pytest.mark.parametrize(("message", "kind"), [
    ("[metal::malloc] Attempting to allocate 9 bytes which is greater than the maximum", None),
    ("[METAL] Command buffer execution failed: Insufficient Memory "
     "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)", OOM),
    ("cudaGraphInstantiate(&graph_exec_, graph_, nullptr, nullptr, 0) failed: out of memory",
     OOM),
    ("[malloc] Unable to allocate 4398046511104 bytes.", OOM),
    ("CUDA error: an illegal memory access was encountered", DEVICE),
    ("cudaStreamSynchronize failed: unspecified launch failure", DEVICE),
    ("[METAL] Command buffer execution failed: Caused GPU Timeout Error", DEVICE),
    ("[matmul] Last dimension of first input with shape (1,2) must match", None),
])
def test_failures_are_told_apart(message, kind):
    assert classify(RuntimeError(message)) == kind
    assert classify(ValueError(message)) is None  # MLX raises RuntimeError for these
    assert classify(MemoryError()) == OOM


def test_fault_injection_every_nth_step_and_a_sticky_device():
    gov = Governor(MemoryConfig(fault_alloc=3))
    failed = []
    for step in range(1, 10):
        try:
            gov.inject()
        except RuntimeError as exc:
            assert classify(exc) == OOM
            failed.append(step)
    assert failed == [3, 6, 9] and gov.counts["injected"] == 3
    gov = Governor(MemoryConfig(fault_device=2))
    gov.inject()
    for _ in range(3):  # step 2 and every step after it
        with pytest.raises(RuntimeError) as err:
            gov.inject()
        assert classify(err.value) == DEVICE
    assert Governor().inject() is None  # off by default: no counting either
    env = MemoryConfig.from_config(
        from_environ({"MLXBUN_FAULT_ALLOC": "7", "MLXBUN_FAULT_DEVICE": "x"}), wait_s=2.0)
    assert (env.fault_alloc, env.fault_device, env.wait_s) == (7, 0, 2.0)


def test_lost_is_told_once_and_retry_after_stays_sane():
    meter = Meter(1 << 30)
    gov = Governor(probe=meter.probe, clock=meter.clock)
    told = []
    gov.on_lost = told.append
    gov.lost("illegal memory access")
    gov.lost("again")
    assert told == ["illegal memory access"] and gov.broken == "illegal memory access"
    assert gov.retry_after() == 5  # nothing ended yet: the default
    for _ in range(4):
        meter.now += 2.0
        gov.row_ended()
    assert gov.retry_after() == 2  # requests end every two seconds
    meter.now += 500.0  # nothing ended for long: the wait since, within the cap
    assert gov.retry_after() == 30


def test_the_pool_limit_keeps_the_step_reserve_and_counts_its_own_growth():
    """The limit leaves ``reserve`` bytes free for a step's temporaries; what the
    engine's pool grew by since the last reading (under a second old) is taken off it."""
    meter = Meter(1000 * 4096)
    gov = Governor(MemoryConfig(margin_bytes=0), meter.probe, meter.clock)
    held = {"bytes": 0}
    gov.held = lambda: held["bytes"]
    assert gov.pool_limit(10_000, 64, 4096, reserve=300 * 4096) == 700
    held["bytes"] = 200 * 4096  # the pool grew; the reading does not know yet
    assert gov.available() == 800 * 4096 and meter.reads == 1
    assert gov.pool_limit(10_000, 64, 4096, reserve=300 * 4096) == 500
    meter.available, meter.now = 800 * 4096, meter.now + 1.0  # the next reading sees it
    assert gov.available() == 800 * 4096 and meter.reads == 2
    assert gov.pool_limit(10_000, 900, 4096, reserve=300 * 4096) == 900  # never below
    gov.planned(5000, 4000, trimmed=True)
    gov.planned(3000, 4000, trimmed=False)
    stats = gov.stats()
    assert (stats["step_bytes"], stats["step_room_bytes"], stats["step_peak_bytes"]) == \
        (3000, 4000, 5000)
    assert (stats["steps_trimmed"], stats["steps_over_room"]) == (1, 1)


def test_memory_the_cuda_pool_keeps_counts_and_no_driver_reads_none():
    """What the CUDA driver's pool holds reserved for us but unused is room (MLX's next
    allocation reuses it), within MLX's limit; without a CUDA driver it reads None."""
    info = {"free_memory": 1 << 30, "total_memory": 80 << 30}
    got = cuda_reading(info, cached=1 << 30, active=20 << 30, limit=64 << 30, slack=30 << 30)
    assert got.available == 32 << 30
    capped = cuda_reading(info, cached=0, active=40 << 30, limit=64 << 30, slack=30 << 30)
    assert capped.available == 24 << 30
    import ctypes.util

    from mlxbun_core.engine.cuda_pool import pool_slack
    slack = pool_slack()
    assert slack is None if ctypes.util.find_library("cuda") is None else slack >= 0


def test_room_gives_mlx_cache_back_and_reads_again_once_a_second():
    """Short of what a step wants, the governor gives MLX's cache back and reads again
    before anyone preempts; not more than once a second; enough room asks for nothing."""
    meter = Meter(10 << 30)
    gov = Governor(MemoryConfig(margin_bytes=0), probe=meter.probe, clock=meter.clock)
    given = []

    def give_back() -> None:
        given.append(meter.now)
        meter.available = 20 << 30  # what the cache held is free again
    gov.give_back = give_back
    assert gov.room(5 << 30) == 10 << 30 and not given
    assert gov.room(15 << 30) == 20 << 30 and given == [100.0]
    meter.available = 1 << 30
    meter.now += 0.5
    gov.available(fresh=True)
    assert gov.room(15 << 30) == 1 << 30 and len(given) == 1  # within the second: no
    meter.now += 1.0
    assert gov.room(15 << 30) == 20 << 30 and len(given) == 2
    assert gov.stats()["cache_given_back"] == 2


def test_mlx_limit_follows_the_device_and_never_passes_where_it_started():
    """On CUDA, MLX's memory limit is what it holds plus what the reading leaves it, so
    its allocator drops cached buffers before the driver fails; never past the limit it
    started with, never below what it holds."""
    alone = cuda_reading({"free_memory": 52 << 30, "total_memory": 80 << 30}, cached=5 << 30,
                         active=20 << 30, limit=76 << 30)
    assert follow_limit(alone, 20 << 30, 76 << 30) == 76 << 30  # the device to itself
    crowded = cuda_reading({"free_memory": 1 << 30, "total_memory": 80 << 30},
                           cached=6 << 30, active=20 << 30, limit=76 << 30)
    assert follow_limit(crowded, 20 << 30, 76 << 30) == 27 << 30
    assert follow_limit(Reading(0, 0, "test"), 20 << 30, 76 << 30) == 20 << 30


def test_mlx_cache_may_grow_while_the_device_keeps_a_twentieth_free():
    """MLX's cache limit on CUDA follows the device's free memory: room to grow while a
    twentieth of the device stays free, a limit under what is cached once it is not (MLX
    gives the excess back as it allocates), never below a gigabyte."""
    from mlxbun_core.engine.readings import CACHE_FLOOR, follow_cache

    total = 80 << 30  # keeps 4 GiB free
    assert follow_cache(free=30 << 30, cached=10 << 30, total=total) == 36 << 30
    assert follow_cache(free=1 << 30, cached=50 << 30, total=total) == 47 << 30
    assert follow_cache(free=0, cached=2 << 30, total=total) == CACHE_FLOOR


@pytest.mark.parametrize("total_gib, margin_mib", [(8, 512), (24, 1228), (80, 2048), (141, 2048)])
def test_the_margin_is_a_twentieth_of_the_device_between_512_mib_and_2_gib(total_gib, margin_mib):
    """A twentieth of an 80 GB card kept 4.3 GB back: under another tenant that left 4 GB
    free, 28 of 32 requests were refused while a step needed a few hundred KB."""
    from mlxbun_core.engine.readings import Reading

    gov = Governor(MemoryConfig(), lambda: Reading(total_gib << 30, total_gib << 30, "test"))
    gov.available(fresh=True)
    assert gov.margin >> 20 == margin_mib
