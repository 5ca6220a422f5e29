"""Prefill chunks sized from measured speed, and the default batch sized from the device
and the model: the pure rules, then what a served engine reports."""

from __future__ import annotations

import httpx
import pytest

from mlxbun_core.engine.lanes.pace import MAX_CHUNK, PrefillPacer
from mlxbun_core.library import fit
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server


def test_a_chunk_fits_the_target_time_at_the_measured_rate():
    pacer = PrefillPacer(target_s=0.8)
    pacer.record(32, 3.2)  # 10 tok/s: a slow CPU
    assert pacer.chunk() == 8  # the largest power of two within 0.8 s
    pacer = PrefillPacer(target_s=0.8)
    pacer.record(32, 16.0)  # 2 tok/s
    assert pacer.chunk() == 1
    pacer = PrefillPacer(target_s=0.8)
    pacer.record(2048, 0.1)  # a GPU: the lane's own limit, not a power of two below it
    assert pacer.chunk() == MAX_CHUNK and pacer.chunk(6144) == 6144
    assert pacer.chunk(100_000) == 16384  # a limit past the target: the target's power of two


def test_the_rate_follows_the_device_and_ignores_short_tails():
    pacer = PrefillPacer(target_s=1.0)
    pacer.record(64, 1.0)
    assert pacer.chunk() == 64
    pacer.record(3, 1.0, asked=64)  # a prompt's 3-token tail: its fixed cost says nothing
    assert pacer.chunk() == 64
    pacer.record(64, 4.0, asked=64)  # the machine got busy: smoothed, not jumped
    assert pacer.rate == pytest.approx(40.0) and pacer.chunk() == 32
    pacer.record(32, 0.25, asked=32)  # faster again (or past a first-use compile): at once
    assert pacer.rate == pytest.approx(128.0) and pacer.chunk() == 128


GIB = 1 << 30
LAYOUT = fit.KVLayout(full_bytes_per_token=147_456.0)  # Qwen3-8B: 36 layers x 8 KV heads x 128


@pytest.mark.parametrize("backend,quantized,room,rows,ranks", [
    ("cuda", False, 120 * GIB, 64, 1),  # an H200 with an 8B bf16 model: 200 rows fit, cap 64
    ("metal", False, 6 * GIB, 10, 1),  # a 16 GB Mac: what the KV room holds at 4,096 tokens
    ("cuda", True, 120 * GIB, 8, 1),  # quantized weights batch poorly on CUDA
    ("metal", True, 120 * GIB, 64, 1),  # ... not on Metal
    ("cpu", False, 20 * GIB, 4, 1),  # a CPU decode step is compute-bound
    ("metal", False, GIB // 2, 4, 1),  # not even one row's typical KV fits: the floor
    ("cpu", False, 20 * GIB, 32, 2),  # two ranks: a step waits on their round trips
    ("cpu", False, 2 * GIB, 4, 2),  # ... within what the KV room holds (here the floor)
])
def test_the_default_batch(backend, quantized, room, rows, ranks):
    plan = fit.batch_plan(LAYOUT, room, backend=backend, quantized=quantized, ranks=ranks)
    assert plan.rows == rows
    assert plan.row_bytes == 147_456 * fit.TYPICAL_CONTEXT
    assert plan.memory_rows == room // plan.row_bytes and plan.reason


def test_the_server_reports_its_batch_and_pace():
    path = tiny_checkpoint("llama")
    auto = start_server(path)
    pinned = start_server(path, batch=2)
    try:
        batch = httpx.get(auto.base_url + "/stats").json()["batch"]
        plan = auto.engine.batch_plan
        assert batch["cap"] == plan.rows == auto.engine.batch and batch["cap_source"] == "auto"
        assert batch["auto"]["reason"] == plan.reason and 4 <= batch["cap"] <= 64
        assert batch["prefill"]["prefill_tps"] > 0  # calibrated at start
        batch = httpx.get(pinned.base_url + "/stats").json()["batch"]
        assert (batch["cap"], batch["cap_source"], batch["auto"]) == (2, "--batch", None)
    finally:
        auto.stop()
        pinned.stop()
