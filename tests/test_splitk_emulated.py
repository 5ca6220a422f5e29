"""The split-key paged-attention kernel's CUDA source (``attention._SOURCE``), run on this CPU
(``bench/splitk_emulate.py``: a thread per CUDA thread, warp shuffles across 32 lanes, under
AddressSanitizer), its splits joined by ``flash.combine``, against ``paged_reference`` in
float32. The settings: what ``_splitk_attention`` ships for 4 query heads a KV head (8 warps;
4 keys a warp step at 64 dims, 1 at 256), and 4 warps taking 4 keys or 1. Outputs start as
NaN, so one no block writes fails too. A small CHUNK gives several splits on short rows,
some of them empty (a short row's, or one before a sliding window)."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxbun_core.engine.batch import attention

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from paged_kernel import setup
from splitk_emulate import Emulator, Setting

SHIPPED_G4 = Setting.shipped("float32", 64, 4)
SHIPPED_G1 = Setting.shipped("float32", 256, 4)
SETTINGS = {"shipped-w8-g4": SHIPPED_G4, "shipped-w8-g1": SHIPPED_G1,
            "w4-g4": Setting("float32", 64, 1, 4, 4), "w4-g1": Setting("float32", 64, 4, 4, 1)}
# a planted bug: a warp's last step weighs the keys past the split's end (in[g] unchecked)
UNCHECKED = Setting("float32", 64, 1, 4, 4, plant=("p[g] = in[g] ? __expf(s[g] - mn) : 0.f;",
                                                   "p[g] = __expf(s[g] - mn);"))
# (width, window, ragged row lengths, keys a split)
CASES = {"width1-splits": (1, None, (3, 40, 100), 64),
         "width4-window": (4, 20, (5, 70), 32)}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Emulator:
    """Every setting compiled once, in one program (the planted one too)."""
    return Emulator(tmp_path_factory.mktemp("splitk"), [*SETTINGS.values(), UNCHECKED])


def check(emu: Emulator, setting: Setting, case: tuple) -> None:
    width, window, lengths, chunk = case
    hkv = 2
    q, store, view = setup(len(lengths), list(lengths), hkv * setting.rep, hkv, setting.dim,
                           width, mx.float32)
    scale = setting.dim ** -0.5
    got = emu.attention(setting, q, store, view, window, scale, chunk)
    want = attention.paged_reference(q, store, view, window, scale)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=2e-6)


def test_the_shipped_settings_are_the_ones_tested():
    """Today's warps at both of the shipped keys-a-step: GROUP while 4 heads x 64 dims fit
    the registers, 1 at 256 dims (so a change of the defaults is tested as it ships)."""
    assert SHIPPED_G4.warps == SHIPPED_G1.warps == attention.WARPS
    assert SHIPPED_G4.group == attention.GROUP > 1 and SHIPPED_G1.group == 1


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("setting", SETTINGS.values(), ids=SETTINGS.keys())
def test_the_kernel_matches_the_reference(emulator, setting, case):
    check(emulator, setting, case)


def test_a_key_past_the_split_counted_is_seen(emulator):
    """The planted bug fails where its unplanted twin (``w4-g4``) passes."""
    with pytest.raises(AssertionError, match="Mismatched elements"):
        check(emulator, UNCHECKED, CASES["width4-window"])
