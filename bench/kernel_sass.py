"""The flash kernel as MLX's NVRTC builds it, disassembled: to map a compute-sanitizer
report (``custom_kernel_...+0x18c0``) to an instruction without device time.

MLX wraps a ``cuda_kernel`` body in its own header (``mlx/backend/cuda/device/utils.cuh``)
and compiles it with NVRTC for ``sm_90a`` with ``--device-as-default-execution-space``
(``mlx/backend/cuda/jit_module.cpp``). This does the same here. It needs MLX's device
headers (a checkout of ml-explore/mlx), NVRTC (PyPI ``nvidia-cuda-nvrtc``), ``nvdisasm``
(PyPI ``nvidia-cuda-nvdisasm``) and the CUDA toolkit's headers (cccl), none of which the
suite installs: it is a tool for the kernel's author.

    python bench/kernel_sass.py --mlx /path/to/mlx --nvrtc .../libnvrtc.so.13 \\
        --nvdisasm .../nvdisasm --cuda /usr/local/cuda-13.0 > k.sass
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree

from mlxbun_core.engine.batch import flash

HEADER = ('#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
          "#define inf cuda::std::numeric_limits<float>::infinity()\n\n")
INPUTS = [("q", "__nv_bfloat16"), ("k", "__nv_bfloat16"), ("v", "__nv_bfloat16"),
          ("blocks", "int32_t"), ("starts", "int32_t"), ("params", "int32_t"),
          ("scale", "float")]


def source(name: str, dim: int, rep: int, tile: int, single: bool) -> str:
    out = "__nv_bfloat16" if single else "float"
    args = "".join(f"    const {t}* {n},\n" for n, t in INPUTS)
    args += f"    {out}* acc_out,\n    float* m_out,\n    float* l_out) {{\n"
    consts = (f"  using T = __nv_bfloat16;\n  using O = {out};\n  constexpr int D = {dim};\n"
              f"  constexpr int R = {rep};\n  constexpr int BS = 16;\n"
              f"  constexpr int TILE = {tile};\n  constexpr int NT = {flash.NT};\n"
              f"  constexpr bool SINGLE = {'true' if single else 'false'};\n"
              f"  constexpr bool VECLOAD = {'true' if flash.VECLOAD else 'false'};\n\n")
    return (HEADER + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
            f"__global__ void {name}(\n" + args + consts + flash._SOURCE
            + "\n}\n\n} // namespace mlx::core::cu\n")


def compile_cubin(lib: ctypes.CDLL, src: str, name: str, includes: list[str]) -> bytes:
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None):
        raise SystemExit("nvrtcCreateProgram failed")
    lib.nvrtcAddNameExpression(prog, f"mlx::core::cu::{name}".encode())
    opts = [b"--device-as-default-execution-space", b"--gpu-architecture=sm_90a",
            *(f"--include-path={p}".encode() for p in includes)]
    result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if result:
        raise SystemExit(log.value.decode())
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mlx", required=True, help="a checkout of ml-explore/mlx")
    p.add_argument("--nvrtc", required=True, help="libnvrtc.so")
    p.add_argument("--nvdisasm", required=True)
    p.add_argument("--cuda", default="/usr/local/cuda", help="the toolkit (its include/cccl)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rep", type=int, default=1)
    p.add_argument("--single", action="store_true")
    args = p.parse_args()
    tile = flash.tile_for(args.dim, 2, args.rep)
    name = (f"custom_kernel_mlxbun_paged_attention{'_single' if args.single else ''}"
            f"_bfloat16_t_{'bfloat16_t' if args.single else 'float'}_{args.dim}_{args.rep}"
            f"_16_{tile}_{flash.NT}_{'t' if args.single else 'f'}_{'t' if flash.VECLOAD else 'f'}")
    includes = [args.mlx, os.path.join(args.cuda, "include"),
                os.path.join(args.cuda, "include", "cccl")]
    cubin = compile_cubin(ctypes.CDLL(args.nvrtc),
                          source(name, args.dim, args.rep, tile, args.single), name, includes)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sys.stdout.write(subprocess.run([args.nvdisasm, "-c", f.name], capture_output=True,
                                        text=True, check=True).stdout)


if __name__ == "__main__":
    main()
