"""Compile the paged-attention kernel's CUDA source here, before device time is spent.

``mx.fast.cuda_kernel`` wraps a kernel body in a generated ``__global__`` function
(inputs as ``const`` pointers of their dtypes, outputs as pointers, template arguments
as ``constexpr``/``using`` lines) and compiles it with NVRTC on the device. This renders
the same wrapper for the template arguments the engine uses and runs ``nvcc`` on it
(any machine with the CUDA toolkit; no GPU needed), so a typo costs seconds, not a
device sitting.

    python bench/kernel_source.py            # compiles every variant, prints nvcc's verdict
"""

from __future__ import annotations

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


def main() -> int:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("no nvcc on PATH")
        return 2
    bad = 0
    cases = itertools.product(("bfloat16", "float16", "float32"), (True, False),
                              ((128, 4), (64, 1), (256, 8), (128, 16)))
    renders = [(f"flash {dtype} {'single' if single else 'split'} {dim} {rep}",
                lambda n, d=dtype, s=single, dm=dim, r=rep: render(n, d, s, dm, r, 16))
               for dtype, single, (dim, rep) in cases]
    renders += [(f"splitk {dtype} {dim} {rep} warps {w} group {g} vec {v}",
                 lambda n, d=dtype, dm=dim, r=rep, w=w, g=g, v=v:
                 render_splitk(n, d, dm, r, 16, w, g, v))
                for dtype, (dim, rep), w, g, v in itertools.product(
                    ("bfloat16", "float16", "float32"), ((128, 4), (64, 1), (256, 8)),
                    (2, 8), (1, 4), (False, True))]
    renders += [(f"combine {dtype} {dim}", lambda n, d=dtype, dm=dim: render_combine(n, d, dm))
                for dtype in ("bfloat16", "float16", "float32") for dim in (64, 128, 256)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, make) in enumerate(renders):
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
