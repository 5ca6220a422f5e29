"""The CUDA kernels' sources use only what NVRTC compiles.

MLX compiles ``mx.fast.cuda_kernel`` bodies with NVRTC on the device, which has no host
compiler behind it: ``__builtin_memcpy`` compiled under nvcc here and failed on an H100
for every setting of the split-key kernel (a branch discarded by ``if constexpr`` is
still looked up). ``bench/kernel_source.py --nvrtc`` compiles every variant through NVRTC
where its library is at hand; this keeps the known traps out of the sources everywhere.
"""

from __future__ import annotations

import re

import pytest

from mlxbun_core.engine.batch import attention, flash

SOURCES = {"split-key": attention._SOURCE, "combine": attention._COMBINE,
           "flash": flash._SOURCE}
# host-compiler builtins, the C library, std:: (NVRTC has cuda::std), and headers
FORBIDDEN = re.compile(r"__builtin_\w+|\bmem(?:cpy|set|move)\s*\(|(?<!cuda::)\bstd::"
                       r"|#\s*include|\bprintf\s*\(")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_kernel_source_calls_nothing_nvrtc_lacks(name):
    found = FORBIDDEN.findall(SOURCES[name])
    assert not found, f"{name} kernel uses {found}: NVRTC compiles without a host compiler"


@pytest.mark.parametrize("line", ["__builtin_memcpy(kt, &kw, sizeof(kt));",
                                  "memcpy(a, b, 8);", "std::min(a, b)", "#include <cstring>"])
def test_the_scan_sees_each_trap(line):
    assert FORBIDDEN.search(line)
    assert not FORBIDDEN.search("cuda::std::numeric_limits<float>::infinity()")
