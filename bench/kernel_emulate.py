"""Run the paged-attention CUDA kernel's source on this CPU, under AddressSanitizer.

The kernel body (``engine/batch/flash.py``'s ``_SOURCE``) is wrapped as MLX wraps it
and compiled as C++ with a small emulation of what it uses of CUDA: a thread per CUDA
thread, a barrier per block (``__syncthreads``) and per warp (``__syncwarp``, the
shuffles), ``static`` for ``__shared__`` (blocks run one after another), bfloat16 as a
16-bit struct. Every input lives in an exactly sized heap buffer, so a read or write out
of bounds stops the run with ASan's report. Outputs are compared with the plain-ops
reference (``paged_reference``) on the cases ``bench/paged_kernel.py`` checks on the
device: a wrong index costs seconds here, not a device sitting.

    python bench/kernel_emulate.py [--scalar-loads]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx
import numpy as np

from mlxbun_core.engine.batch import flash

PRELUDE = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using std::max; using std::min;
struct bf16 {
  uint16_t x;
  bf16() = default;
  bf16(float f) { uint32_t u; memcpy(&u, &f, 4); x = (u + 0x7FFF + ((u >> 16) & 1)) >> 16; }
  operator float() const { uint32_t u = uint32_t(x) << 16; float f; memcpy(&f, &u, 4); return f; }
};
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
struct Idx { int x; };
thread_local Idx threadIdx, blockIdx;
static std::barrier<>* block_bar;
static std::barrier<>* warp_bar[32];
static float xchg[32][32];
static void __syncthreads() { block_bar->arrive_and_wait(); }
static void __syncwarp() { warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
// every lane of the warp posts its value, then reads its partner's (lane ^ off; its own
// past the warp, as CUDA does); only full-warp masks: a lane left out would hang here
static float __shfl_xor_sync(unsigned mask, float v, int off) {
  if (mask != 0xffffffffu) { fprintf(stderr, "shuffle mask %x: not emulated\n", mask); abort(); }
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  xchg[w][l] = v; warp_bar[w]->arrive_and_wait();
  float r = (l ^ off) < 32 ? xchg[w][l ^ off] : v; warp_bar[w]->arrive_and_wait();
  return r;
}
#define __expf expf
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
"""

MAIN = r"""
template <typename X> std::vector<X> load(const char* path, size_t n) {
  std::vector<X> v(n); FILE* f = fopen(path, "rb");
  if (!f || fread(v.data(), sizeof(X), n, f) != n) { fprintf(stderr, "read %s\n", path); exit(2); }
  fclose(f); return v;
}
int main(int argc, char** argv) {
  // argv: dir nq nk nblocks rows nblk nout nml
  const char* d = argv[1];
  size_t nq = atol(argv[2]), nk = atol(argv[3]), nb = atol(argv[4]), rows = atol(argv[5]);
  long blocks_n = atol(argv[6]); size_t nout = atol(argv[7]), nml = atol(argv[8]);
  std::string p(d);
  auto q = load<TIN>((p + "/q").c_str(), nq);
  auto k = load<TIN>((p + "/k").c_str(), nk);
  auto v = load<TIN>((p + "/v").c_str(), nk);
  auto bl = load<int32_t>((p + "/blocks").c_str(), nb);
  auto st = load<int32_t>((p + "/starts").c_str(), rows);
  auto pa = load<int32_t>((p + "/params").c_str(), 6);
  auto sc = load<float>((p + "/scale").c_str(), 1);
  // NaN until written: an output no thread block writes is garbage on a device (MLX
  // does not clear a kernel's outputs), and a zero here would hide it
  std::vector<TOUT> acc(nout, TOUT(NAN)); std::vector<float> m(nml, NAN), l(nml, NAN);
  for (long blk = 0; blk < blocks_n; ++blk) {
    std::barrier<> b(NT_); block_bar = &b;
    std::vector<std::barrier<>*> ws;
    for (int w = 0; w < NT_ / 32; ++w) {
      ws.push_back(new std::barrier<>(32)); warp_bar[w] = ws.back();
    }
    std::vector<std::thread> ts;
    for (int t = 0; t < NT_; ++t)
      ts.emplace_back([&, t] { threadIdx.x = t; blockIdx.x = (int)blk;
        kernel(q.data(), k.data(), v.data(), bl.data(), st.data(), pa.data(), sc.data(),
               acc.data(), m.data(), l.data()); });
    for (auto& t : ts) t.join();
    for (auto* w : ws) delete w;
  }
  FILE* f = fopen((p + "/acc_out").c_str(), "wb");
  fwrite(acc.data(), sizeof(TOUT), nout, f); fclose(f);
  f = fopen((p + "/m_out").c_str(), "wb"); fwrite(m.data(), 4, nml, f); fclose(f);
  f = fopen((p + "/l_out").c_str(), "wb"); fwrite(l.data(), 4, nml, f); fclose(f);
  return 0;
}
"""

C_TYPE = {"bfloat16": "bf16", "float32": "float"}


def source(dtype: str, single: bool, dim: int, rep: int, block: int, tile: int) -> str:
    tin = C_TYPE[dtype]
    tout = tin if single else "float"
    sig = (f"void kernel(const {tin}* q, const {tin}* k, const {tin}* v, const int32_t* blocks,"
           f" const int32_t* starts, const int32_t* params, const float* scale, {tout}* acc_out,"
           " float* m_out, float* l_out) {\n")
    consts = (f"  using T = {tin}; using O = {tout};\n  constexpr int D = {dim}; constexpr int R = "
              f"{rep}; constexpr int BS = {block}; constexpr int TILE = {tile};\n  constexpr int "
              f"NT = {flash.NT}; constexpr bool SINGLE = {'true' if single else 'false'};\n"
              f"  constexpr bool VECLOAD = {'true' if flash.VECLOAD else 'false'};\n")
    return (PRELUDE + sig + consts + flash._SOURCE + "\n}\n"
            + f"#define TIN {tin}\n#define TOUT {tout}\n#define NT_ {flash.NT}\n" + MAIN)


def run_case(tmp: str, hq: int, hkv: int, dim: int, width: int, window, dtype,
             lengths=(5, 70, 300)) -> float:
    """The kernel's largest error on one case, in ``paged_kernel.ulps`` (<= 1: right)."""
    from paged_kernel import host_reference, setup, ulps

    q, store, view = setup(len(lengths), list(lengths), hq, hkv, dim, width, dtype)
    keys = store.keys
    rep = hq // hkv
    tile = flash.tile_for(dim, keys.dtype.size, rep)
    rows = q.shape[0]
    splits, chunk = flash.splits_for(rows, hkv, width, int(view.starts.max()) + width, tile)
    single = splits == 1
    name = "bfloat16" if dtype == mx.bfloat16 else "float32"
    src = os.path.join(tmp, f"k_{name}_{single}_{dim}_{rep}.cpp")
    exe = src[:-4]
    if not os.path.exists(exe):
        with open(src, "w") as f:
            f.write(source(name, single, dim, rep, store.pool.block_size, tile))
        opt = os.environ.get("EMU_OPT", "-O1")  # (-O3: what strict aliasing would break)
        got = subprocess.run(["g++", "-std=c++20", opt, "-g", "-fsanitize=address", "-pthread",
                              src, "-o", exe], capture_output=True, text=True)
        if got.returncode:
            raise SystemExit(got.stderr[-4000:])
    raw = np.uint16 if name == "bfloat16" else np.float32

    def dump(fname, a):
        arr = np.array(a.view(mx.uint16) if name == "bfloat16" and a.dtype == mx.bfloat16 else a)
        arr.astype(raw if a.dtype in (mx.bfloat16, mx.float32) else np.int32).tofile(
            os.path.join(tmp, fname))

    dump("q", q)
    dump("k", keys)
    dump("v", store.values)
    np.array(view.blocks, dtype=np.int32).tofile(os.path.join(tmp, "blocks"))
    np.array(view.offset, dtype=np.int32).tofile(os.path.join(tmp, "starts"))
    np.array([width, view.blocks.shape[1], window or 0, hkv, splits, chunk],
             dtype=np.int32).tofile(os.path.join(tmp, "params"))
    np.array([dim ** -0.5], dtype=np.float32).tofile(os.path.join(tmp, "scale"))
    nout = rows * hq * width * dim * (1 if single else splits)
    nml = 1 if single else rows * hq * width * splits
    got = subprocess.run([exe, tmp, str(q.size), str(keys.size), str(view.blocks.size),
                          str(rows), str(rows * hkv * width * splits), str(nout), str(nml)],
                         capture_output=True, text=True)
    if got.returncode:
        raise SystemExit(f"case {hq}/{hkv}/{dim} w{width} win{window} {name}:\n"
                         + got.stderr[-4000:])
    out_t = raw if single else np.float32
    acc = np.fromfile(os.path.join(tmp, "acc_out"), dtype=out_t)
    if single:
        a = mx.array(acc.reshape(rows, hq, width, dim))
        a = a.view(mx.bfloat16).astype(mx.float32) if name == "bfloat16" else a
    else:
        m = mx.array(np.fromfile(os.path.join(tmp, "m_out"), dtype=np.float32))
        total = mx.array(np.fromfile(os.path.join(tmp, "l_out"), dtype=np.float32))
        part = (rows, hq, width, splits)
        a = flash.combine(mx.array(acc).reshape(*part, dim), m.reshape(part),
                              total.reshape(part))
    if not single:
        a = a.astype(dtype)  # as flash_attention returns it
    return ulps(a, host_reference(q, store, view, window, dim ** -0.5), dtype)


def main() -> int:
    if "--scalar-loads" in sys.argv:
        flash.VECLOAD = False
    if shutil.which("g++") is None:
        print("no g++")
        return 2
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for hq, hkv, dim in ((8, 8, 64), (32, 8, 128), (16, 2, 128), (8, 1, 256)):
            for width in (1, 4):
                for window in (None, 37):
                    for dtype in (mx.bfloat16, mx.float32):
                        err = run_case(tmp, hq, hkv, dim, width, window, dtype)
                        ok = err <= 1.0
                        bad += not ok
                        print(hq, hkv, dim, width, window, dtype, f"{err:.3f} ulps",
                              "ok" if ok else "WRONG", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
