"""Run the split-key paged-attention CUDA kernel's source on this CPU, under AddressSanitizer.

``engine/batch/attention.py``'s ``_SOURCE`` is wrapped as MLX wraps it (its template
arguments T, D, R, BS, WARPS, G, VEC as ``using``/``constexpr`` lines in the function) and
compiled as C++ with ``kernel_emulate``'s small CUDA: a thread per CUDA thread, a barrier
per block for ``__syncthreads`` and per warp for the shuffles (each of a warp's 32 lanes
posts its value, then reads its partner's), ``static`` for ``__shared__``. Every setting a
caller asks for is a namespace of one program, so one compile serves them all; the
threads live for the whole grid and run its blocks one after another. The outputs start
as NaN (a block that leaves one unwritten shows), and ``flash.combine`` joins the splits
as ``FUSED = False`` does on the device.

    python bench/splitk_emulate.py      # the settings below against the plain-ops reference
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx
import numpy as np

from kernel_emulate import C_TYPE, PRELUDE
from mlxbun_core.engine.batch import attention, flash

LAUNCH = r"""
template <typename X> std::vector<X> load(const std::string& path, size_t n) {
  std::vector<X> v(n); FILE* f = fopen(path.c_str(), "rb");
  if (!f || fread(v.data(), sizeof(X), n, f) != n) { fprintf(stderr, "read %s\n", path.c_str());
                                                      exit(2); }
  fclose(f); return v;
}
template <typename T>
using Kernel = void (*)(const T*, const T*, const T*, const int32_t*, const int32_t*,
                        const int32_t*, const float*, float*, float*, float*);
// argv: dir nq nk nblocks rows grid nml
template <typename T> int launch(Kernel<T> kernel, int nt, char** argv) {
  const std::string p(argv[0]);
  const size_t nq = atol(argv[1]), nk = atol(argv[2]), nb = atol(argv[3]), rows = atol(argv[4]);
  const long grid = atol(argv[5]); const size_t nml = atol(argv[6]), nout = nml * atol(argv[7]);
  auto q = load<T>(p + "/q", nq); auto k = load<T>(p + "/k", nk); auto v = load<T>(p + "/v", nk);
  auto bl = load<int32_t>(p + "/blocks", nb); auto st = load<int32_t>(p + "/starts", rows);
  auto pa = load<int32_t>(p + "/params", 6); auto sc = load<float>(p + "/scale", 1);
  // NaN until written: MLX does not clear a kernel's outputs, and a zero would hide a gap
  std::vector<float> acc(nout, NAN), m(nml, NAN), l(nml, NAN);
  std::barrier<> block(nt), between(nt); block_bar = &block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  for (int w = 0; w < nt / 32; ++w) {
    warps.push_back(std::make_unique<std::barrier<>>(32)); warp_bar[w] = warps.back().get();
  }
  std::vector<std::thread> ts;
  for (int t = 0; t < nt; ++t)
    ts.emplace_back([&, t] {
      threadIdx.x = t;
      for (long b = 0; b < grid; ++b) {  // (static "shared" memory: one block at a time)
        blockIdx.x = (int)b;
        kernel(q.data(), k.data(), v.data(), bl.data(), st.data(), pa.data(), sc.data(),
               acc.data(), m.data(), l.data());
        between.arrive_and_wait();
      }
    });
  for (auto& t : ts) t.join();
  FILE* f = fopen((p + "/acc_out").c_str(), "wb"); fwrite(acc.data(), 4, nout, f); fclose(f);
  f = fopen((p + "/m_out").c_str(), "wb"); fwrite(m.data(), 4, nml, f); fclose(f);
  f = fopen((p + "/l_out").c_str(), "wb"); fwrite(l.data(), 4, nml, f); fclose(f);
  return 0;
}
"""


@dataclass(frozen=True)
class Setting:
    """One compile of the kernel: its template arguments."""

    dtype: str  # "float32" or "bfloat16"
    dim: int
    rep: int  # query heads per KV head
    warps: int
    group: int  # keys a warp takes at a time (G)
    vec: bool = False
    block: int = 16  # the pool's block size (BS)
    plant: tuple[str, str] | None = None  # (text, replacement): a bug planted in the body

    @classmethod
    def shipped(cls, dtype: str, dim: int, rep: int) -> Setting:
        """The warps and group ``_splitk_attention`` launches for these heads today."""
        warps, group = attention.launch_shape(rep, dim)
        return cls(dtype, dim, rep, warps, group, attention.VEC)


def _kernel(name: str, s: Setting, body: str) -> str:
    t = C_TYPE[s.dtype]
    if s.plant is not None:
        planted = body.replace(*s.plant, 1)
        assert planted != body, f"no {s.plant[0]!r} to plant in"
        body = planted
    return (f"namespace {name} {{\nvoid kernel(const {t}* q, const {t}* k, const {t}* v,"
            " const int32_t* blocks, const int32_t* starts, const int32_t* params,"
            " const float* scale, float* acc_out, float* m_out, float* l_out) {\n"
            f"  using T = {t};\n  constexpr int D = {s.dim};\n  constexpr int R = {s.rep};\n"
            f"  constexpr int BS = {s.block};\n  constexpr int WARPS = {s.warps};\n"
            f"  constexpr int G = {s.group};\n"
            f"  constexpr bool VEC = {'true' if s.vec else 'false'};\n{body}\n}}\n}}\n")


def program(settings: list[Setting], body: str) -> str:
    """One C++ program holding ``body`` once per setting; its first argument picks one."""
    kernels = "".join(_kernel(f"s{i}", s, body) for i, s in enumerate(settings))
    cases = "".join(f"    case {i}: return launch<{C_TYPE[s.dtype]}>(s{i}::kernel, "
                    f"{s.warps * 32}, argv + 2);\n" for i, s in enumerate(settings))
    return (PRELUDE + "#include <memory>\n#include <string>\n" + kernels + LAUNCH
            + "int main(int argc, char** argv) {\n  switch (atoi(argv[1])) {\n" + cases
            + "  }\n  return 3;\n}\n")


class Emulator:
    """The compiled program for ``settings``; :meth:`attention` runs one of them."""

    def __init__(self, folder: str | Path, settings: list[Setting],
                 body: str | None = None) -> None:
        """Compile ``body`` (``attention._SOURCE`` unless given) once per setting."""
        self.folder = Path(folder)
        self.settings = list(settings)
        src = self.folder / "splitk.cpp"
        src.write_text(program(self.settings, attention._SOURCE if body is None else body))
        self.exe = self.folder / "splitk"
        opt = os.environ.get("EMU_OPT", "-O1")
        got = subprocess.run(["g++", "-std=c++20", opt, "-g", "-fsanitize=address",
                              "-pthread", str(src), "-o", str(self.exe)],
                             capture_output=True, text=True)
        if got.returncode:
            raise RuntimeError(got.stderr[-4000:])

    def partials(self, setting: Setting, q: mx.array, store, view, window: int | None,
                 scale: float, chunk: int) -> tuple[mx.array, mx.array, mx.array]:
        """The kernel's (weighted values, max, sum) per split, as ``_splitk_attention``
        launches it (one block per row, KV head, query position and split)."""
        keys, values = store.keys, store.values
        rows, heads, width, dim = q.shape
        hkv = keys.shape[1]
        assert (dim, heads // hkv, store.pool.block_size) == (setting.dim, setting.rep,
                                                                setting.block)
        splits = max(1, -(-(int(view.starts.max()) + width) // chunk))
        run = self.folder / "run"
        run.mkdir(exist_ok=True)
        for name, a in (("q", q.astype(keys.dtype)), ("k", keys), ("v", values)):
            raw = a.view(mx.uint16) if a.dtype == mx.bfloat16 else a
            np.array(raw).tofile(run / name)
        np.array(view.blocks, dtype=np.int32).tofile(run / "blocks")
        np.array(view.offset, dtype=np.int32).tofile(run / "starts")
        np.array([width, view.blocks.shape[1], window or 0, hkv, splits, chunk],
                 dtype=np.int32).tofile(run / "params")
        np.array([scale], dtype=np.float32).tofile(run / "scale")
        part = (rows, heads, width, splits)
        args = [q.size, keys.size, view.blocks.size, rows, rows * hkv * width * splits,
                int(np.prod(part)), dim]
        got = subprocess.run([str(self.exe), str(self.settings.index(setting)), str(run),
                              *map(str, args)], capture_output=True, text=True, timeout=120)
        if got.returncode:
            raise RuntimeError(f"{setting}: exit {got.returncode}\n{got.stderr[-4000:]}")

        def read(name: str, shape: tuple[int, ...]) -> mx.array:
            return mx.array(np.fromfile(run / name, dtype=np.float32).reshape(shape))

        return read("acc_out", (*part, dim)), read("m_out", part), read("l_out", part)

    def attention(self, setting: Setting, q: mx.array, store, view, window: int | None,
                  scale: float, chunk: int = attention.CHUNK) -> mx.array:
        """The kernel's attention in float32: its partials joined by ``flash.combine``."""
        return flash.combine(*self.partials(setting, q, store, view, window, scale, chunk))


def main() -> int:
    from paged_kernel import setup

    settings = [Setting.shipped("float32", 128, 4), Setting.shipped("float32", 256, 4),
                Setting("float32", 64, 1, 4, 4), Setting("float32", 64, 4, 4, 1),
                Setting("bfloat16", 128, 4, 8, 4, vec=True)]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        emu = Emulator(tmp, settings)
        for s in settings:
            for width, window, lengths, chunk in ((1, None, (3, 40, 300), 256),
                                                  (4, 20, (5, 70), 32)):
                dtype = mx.bfloat16 if s.dtype == "bfloat16" else mx.float32
                q, store, view = setup(len(lengths), list(lengths), 2 * s.rep, 2, s.dim,
                                       width, dtype)
                scale = s.dim ** -0.5
                got = emu.attention(s, q, store, view, window, scale, chunk)
                want = attention.paged_reference(q.astype(mx.float32), _f32(store), view,
                                                 window, scale)
                err = float(mx.abs(got - want).max())
                ok = err < (1e-2 if s.dtype == "bfloat16" else 1e-5)
                bad += not ok
                print(s, width, window, lengths, chunk, f"max err {err:.2e}",
                      "ok" if ok else "WRONG", flush=True)
    return 1 if bad else 0


def _f32(store):
    """``store`` seen in float32 (the reference's sums, not its inputs, are float32)."""
    from types import SimpleNamespace

    return SimpleNamespace(gather=lambda blocks: tuple(a.astype(mx.float32)
                                                       for a in store.gather(blocks)))


if __name__ == "__main__":
    sys.exit(main())
