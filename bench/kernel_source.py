"""Compile the paged-attention kernel's CUDA source here, before device time is spent.

``mx.fast.cuda_kernel`` wraps a kernel body in a generated ``__global__`` function
(inputs as ``const`` pointers of their dtypes, outputs as pointers, template arguments
as ``constexpr``/``using`` lines) and compiles it with NVRTC on the device. This renders
the same wrapper for the template arguments the engine uses and runs ``nvcc`` on it
(any machine with the CUDA toolkit; no GPU needed), so a typo costs seconds, not a
device sitting. nvcc is not NVRTC: it knows the host compiler's builtins
(``__builtin_memcpy`` compiled here and failed on the device), so ``--nvrtc`` compiles
through NVRTC itself (the ``nvidia-cuda-nvrtc`` wheel's library) behind MLX's own device
header (``--mlx-include``: a directory holding ``mlx/backend/cuda/device/utils.cuh``).

    python bench/kernel_source.py            # compiles every variant, prints nvcc's verdict
    python bench/kernel_source.py --nvrtc .../libnvrtc.so.13 --mlx-include DIR
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree

from mlxbun_core.engine.batch import flash

CUDA = {"bfloat16": "__nv_bfloat16", "float16": "__half", "float32": "float", "int32": "int32_t"}
HEADER = "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cstdint>\n" \
         "#include <cooperative_groups.h>\n"


MLX_HEADER = '#include "mlx/backend/cuda/device/utils.cuh"\n#include <cooperative_groups.h>\n' \
    "#define inf cuda::std::numeric_limits<float>::infinity()\n"
TOOLKIT = "/usr/local/cuda-13.0"


def wrap(name: str, inputs: list[tuple[str, str]], outputs: list[tuple[str, str]],
         consts: list[str], body: str) -> str:
    """``body`` in the ``__global__`` function MLX generates: inputs as ``const`` pointers
    of their dtypes, outputs as pointers, the template arguments as ``consts`` lines."""
    args = [f"    const {CUDA[t]}* {n}" for n, t in inputs]
    args += [f"    {CUDA[t]}* {n}" for n, t in outputs]
    return (HEADER + "namespace mlx::core::cu {\n__global__ void " + name + "(\n"
            + ",\n".join(args) + ") {\n" + "\n".join(consts) + "\n" + body + "\n}\n}\n")


def _attention_inputs(dtype: str) -> list[tuple[str, str]]:
    return [("q", dtype), ("k", dtype), ("v", dtype), ("blocks", "int32"),
            ("starts", "int32"), ("params", "int32"), ("scale", "float32")]


def render(name: str, dtype: str, single: bool, dim: int, rep: int, block: int) -> str:
    size = 4 if dtype == "float32" else 2
    tile = flash.tile_for(dim, size, rep)
    outs = [("acc_out", dtype if single else "float32"), ("m_out", "float32"),
            ("l_out", "float32")]
    consts = [f"  using T = {CUDA[dtype]};", f"  using O = {CUDA[outs[0][1]]};",
              f"  constexpr int D = {dim};", f"  constexpr int R = {rep};",
              f"  constexpr int BS = {block};", f"  constexpr int TILE = {tile};",
              f"  constexpr int NT = {flash.NT};",
              f"  constexpr bool SINGLE = {'true' if single else 'false'};",
              f"  constexpr bool VECLOAD = {'true' if flash.VECLOAD else 'false'};"]
    return wrap(name, _attention_inputs(dtype), outs, consts, flash._SOURCE)


def render_splitk(name: str, dtype: str, dim: int, rep: int, block: int, warps: int,
                  group: int, vec: bool) -> str:
    """The split-key kernel (``attention._SOURCE``) as MLX would wrap it."""
    from mlxbun_core.engine.batch import attention

    outs = [("acc_out", "float32"), ("m_out", "float32"), ("l_out", "float32")]
    consts = [f"  using T = {CUDA[dtype]};", f"  constexpr int D = {dim};",
              f"  constexpr int R = {rep};", f"  constexpr int BS = {block};",
              f"  constexpr int WARPS = {warps};", f"  constexpr int G = {group};",
              f"  constexpr bool VEC = {'true' if vec else 'false'};"]
    return wrap(name, _attention_inputs(dtype), outs, consts, attention._SOURCE)


def render_combine(name: str, dtype: str, dim: int) -> str:
    """The splits' combine kernel (``attention._COMBINE``) as MLX would wrap it."""
    from mlxbun_core.engine.batch import attention

    inputs = [("acc", "float32"), ("m", "float32"), ("total", "float32"),
              ("params", "int32")]
    consts = [f"  using T = {CUDA[dtype]};", f"  constexpr int D = {dim};"]
    return wrap(name, inputs, [("out", dtype)], consts, attention._COMBINE)


def nvrtc_compile(lib: ctypes.CDLL, src: str, name: str, includes: list[str]) -> tuple[bool, str]:
    """``src`` through NVRTC as MLX's custom kernels are (sm_90a, device code by
    default); whether it compiled, and NVRTC's log."""
    src = src.replace(HEADER, MLX_HEADER)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
    lib.nvrtcAddNameExpression(prog, f"mlx::core::cu::{name}".encode())
    opts = [b"--device-as-default-execution-space", b"--gpu-architecture=sm_90a",
            b"-std=c++17"] + [f"--include-path={d}".encode() for d in includes]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, log.value.decode(errors="replace")


def renders() -> list:
    """(label, render(name)) for every variant the engine may compile."""
    cases = itertools.product(("bfloat16", "float16", "float32"), (True, False),
                              ((128, 4), (64, 1), (256, 8), (128, 16)))
    out = [(f"flash {dtype} {'single' if single else 'split'} {dim} {rep}",
            lambda n, d=dtype, s=single, dm=dim, r=rep: render(n, d, s, dm, r, 16))
           for dtype, single, (dim, rep) in cases]
    out += [(f"splitk {dtype} {dim} {rep} warps {w} group {g} vec {v}",
             lambda n, d=dtype, dm=dim, r=rep, w=w, g=g, v=v:
             render_splitk(n, d, dm, r, 16, w, g, v))
            for dtype, (dim, rep), w, g, v in itertools.product(
                ("bfloat16", "float16", "float32"), ((128, 4), (64, 1), (256, 8)),
                (2, 8), (1, 4), (False, True))]
    out += [(f"combine {dtype} {dim}", lambda n, d=dtype, dm=dim: render_combine(n, d, dm))
            for dtype in ("bfloat16", "float16", "float32") for dim in (64, 128, 256)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvrtc", help="libnvrtc.so's path: compile with NVRTC, not nvcc")
    ap.add_argument("--mlx-include", help="the directory holding MLX's mlx/backend/cuda headers")
    args = ap.parse_args()
    nvcc = shutil.which("nvcc")
    if nvcc is None and not args.nvrtc:
        print("no nvcc on PATH")
        return 2
    lib = ctypes.CDLL(args.nvrtc) if args.nvrtc else None
    includes = [args.mlx_include or ".", f"{TOOLKIT}/include", f"{TOOLKIT}/include/cccl",
                f"{TOOLKIT}/targets/x86_64-linux/include"]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, make) in enumerate(renders()):
            if lib is not None:
                ok, log = nvrtc_compile(lib, make(f"k{i}"), f"k{i}", includes)
                print(label, "ok" if ok else "FAILED")
                if not ok:
                    print(log[-3000:])
                    bad += 1
                continue
            path = os.path.join(tmp, f"k{i}.cu")
            with open(path, "w") as f:
                f.write(make(f"k{i}"))
            got = subprocess.run([nvcc, "-arch=sm_90", "-std=c++17", "-c", path, "-o",
                                  os.path.join(tmp, f"k{i}.o"), "-Xptxas", "-v"],
                                 capture_output=True, text=True)
            regs = [ln.strip() for ln in got.stderr.splitlines() if "registers" in ln]
            print(label, "ok" if got.returncode == 0 else "FAILED", *(regs[:1]))
            if got.returncode:
                print(got.stderr[-3000:])
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
