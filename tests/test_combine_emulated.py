"""The split-key kernel's one-launch combine (``attention._COMBINE``, ``FUSED``) compiled as
C++ on this CPU, a loop over the CUDA threads, against ``flash.combine``'s plain ops: the
same output for ragged splits, an empty split (max -inf) among them, and a grid that
overshoots the outputs (the extra threads must write nothing)."""

from __future__ import annotations

import subprocess

import mlx.core as mx
import numpy as np

from mlxbun_core.engine.batch import attention, flash

SHIM = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>
struct Idx { int x; };
static Idx threadIdx, blockIdx, blockDim;
#define __expf expf
constexpr int D = %(dim)d;
using T = float;
static void kernel(const float* acc, const float* m, const float* total,
                   const int32_t* params, T* out) {
%(body)s
}
int main() {
  const int S = %(splits)d, N = %(n)d, R = N / D;
  std::vector<float> acc(R * S * D), m(R * S), total(R * S);
  FILE* f = fopen("%(inp)s", "rb");
  if (fread(acc.data(), 4, acc.size(), f) != acc.size() || fread(m.data(), 4, m.size(), f)
      != m.size() || fread(total.data(), 4, total.size(), f) != total.size()) return 2;
  fclose(f);
  std::vector<float> out(N + 256, -7.0f);  // past the end: must stay untouched
  const int32_t params[2] = {S, N};
  blockDim.x = 256;
  for (blockIdx.x = 0; blockIdx.x < (N + 255) / 256; ++blockIdx.x)
    for (threadIdx.x = 0; threadIdx.x < 256; ++threadIdx.x)
      kernel(acc.data(), m.data(), total.data(), params, out.data());
  f = fopen("%(outp)s", "wb"); fwrite(out.data(), 4, out.size(), f); fclose(f);
  return 0;
}
"""


def test_the_fused_combine_equals_the_plain_ops(tmp_path):
    rows, heads, width, splits, dim = 3, 4, 2, 3, 64
    rng = np.random.default_rng(3)
    acc = rng.normal(size=(rows, heads, width, splits, dim)).astype(np.float32)
    m = rng.normal(size=(rows, heads, width, splits)).astype(np.float32)
    total = rng.uniform(0.5, 3.0, size=(rows, heads, width, splits)).astype(np.float32)
    m[..., 2][:, :, 0] = -np.inf  # an empty split: no keys of its chunk were visible
    total[..., 2][:, :, 0] = 0.0
    inp, outp = tmp_path / "in.bin", tmp_path / "out.bin"
    inp.write_bytes(acc.tobytes() + m.tobytes() + total.tobytes())
    n = rows * heads * width * dim
    src = tmp_path / "combine.cpp"
    src.write_text(SHIM % {"dim": dim, "body": attention._COMBINE, "splits": splits, "n": n,
                           "inp": inp, "outp": outp})
    exe = tmp_path / "combine"
    subprocess.run(["g++", "-std=c++17", "-O1", str(src), "-o", str(exe)], check=True)
    subprocess.run([str(exe)], check=True)
    got = np.frombuffer(outp.read_bytes(), dtype=np.float32)
    want = np.array(flash.combine(mx.array(acc), mx.array(m), mx.array(total))).reshape(-1)
    np.testing.assert_allclose(got[:n], want, rtol=1e-5, atol=1e-6)
    assert (got[n:] == -7.0).all()  # the grid's extra threads wrote nothing
