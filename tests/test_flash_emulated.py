"""The flash paged-attention kernel's CUDA source, run on this CPU (``bench/kernel_emulate.py``:
a thread per CUDA thread, under AddressSanitizer) against the float64 host reference, on
Qwen3-8B's head shape at a verify width of 4 (4 query heads to a KV head of 128 dims: the case
that gave NaN on an H100; 2 KV heads, not its 8, as a block's work is the same and 4 times
fewer blocks run). Outputs start as NaN, as a device's unwritten memory may be, so an output no
thread block writes fails here too."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import pytest

from mlxbun_core.engine.batch import flash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import kernel_emulate


@pytest.mark.parametrize("lengths", [(5, 140), (5, 40)], ids=["splits", "single"])
def test_gqa4_width4_matches_the_float64_reference(tmp_path, lengths):
    """Three splits of the keys (partials combined by plain ops), then one (the kernel
    normalises and writes bf16 itself): every output within one bf16 unit."""
    err = kernel_emulate.run_case(str(tmp_path), 8, 2, 128, 4, None, mx.bfloat16, lengths)
    assert err <= 1.0


def test_an_output_left_unwritten_is_seen(tmp_path, monkeypatch):
    """A planted bug: a block whose split holds none of its keys returns without writing
    its partials (on a device: whatever the memory held). The combine ignores an empty
    split's values only when they say it is empty, so it must come out NaN here."""
    planted = flash._SOURCE.replace("    __shared__ __align__(16) T ks",
                                    "    if (hi < lo) return;\n    __shared__ __align__(16) T ks",
                                    1)
    assert planted != flash._SOURCE
    monkeypatch.setattr(flash, "_SOURCE", planted)
    # (a small shape: any empty split shows it; the row of 5 keys leaves two of three empty)
    err = kernel_emulate.run_case(str(tmp_path), 8, 2, 64, 1, None, mx.bfloat16, (5, 140))
    assert err == float("inf")
    monkeypatch.setattr(flash, "_SOURCE", flash._SOURCE.replace("    if (hi < lo) return;\n",
                                                                "", 1))
    fresh = tmp_path / "unplanted"  # (its own build folder)
    fresh.mkdir()
    assert kernel_emulate.run_case(str(fresh), 8, 2, 64, 1, None, mx.bfloat16,
                                   (5, 140)) <= 1.0  # the same shape, unplanted: right
