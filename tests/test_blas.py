"""MLX's CPU matrix products run on OpenBLAS, not the reference BLAS its Linux wheel bundles.

The checks are structural: the pointer libmlx calls ``cblas_sgemm`` through is read from
its import table and ``dladdr`` names the library it lands in, in a fresh process as a
user's ``mlxbun`` (or a job / ``--isolate`` child) would start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import serve

pytestmark = pytest.mark.skipif(sys.platform != "linux",
                                reason="the BLAS is routed on Linux CPU builds only")

PROBE = """
import ctypes, json, sys
{first}
import numpy as np
from mlxbun_core import blas
from mlxbun_core.blas import elf, route
libmlx = elf.loaded_library("/libmlx.so")
base = elf.loaded_base(libmlx)
slots = elf.import_slots(libmlx, route.ROUTED).by_name
pointers = {{n: elf.read_pointer(base + offs[0]) for n, offs in slots.items()}}
out = {{"state": blas.state().describe(),
        "owners": {{n: elf.owner(p) for n, p in pointers.items()}}}}
provider = route.find_provider("auto")
if provider is not None:
    lib = ctypes.CDLL(str(provider.path))
    out["same_address"] = {{n: p == ctypes.cast(getattr(lib, provider.prefix + n),
                                                ctypes.c_void_p).value
                           for n, p in pointers.items()}}
rng = np.random.default_rng(0)
a, b = rng.standard_normal((67, 45)), rng.standard_normal((45, 33))
errs = {{}}
for name, dt in (("float32", mx.float32), ("float64", mx.float64), ("complex64", mx.complex64)):
    with mx.stream(mx.cpu):
        got = np.array(mx.array(a).astype(dt) @ mx.array(b).astype(dt))
    errs[name] = float(np.abs(got - a @ b).max())
out["max_error"] = errs
print(json.dumps(out))
"""


def probe(first: str = "import mlxbun_core\nimport mlx.core as mx", **env) -> tuple[dict, str]:
    """A fresh interpreter's view of which library serves libmlx's gemm calls."""
    env = {**os.environ, **env}
    env.pop("MLXBUN_BLAS_WARNED", None)
    r = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_a_fresh_process_routes_every_gemm_to_openblas():
    out, stderr = probe()
    assert out["state"]["active"] == "openblas", out
    assert set(out["owners"]) == {"cblas_sgemm", "cblas_dgemm", "cblas_cgemm"}
    for name, owner in out["owners"].items():
        assert "openblas" in os.path.basename(owner).lower(), (name, owner)
    assert all(out["same_address"].values()), out["same_address"]
    assert out["state"]["library"] == out["owners"]["cblas_sgemm"]
    assert max(out["max_error"].values()) < 1e-3, out["max_error"]  # same ABI: right answers
    assert "reference BLAS" not in stderr


def test_mlx_imported_before_mlxbun_is_routed_too():
    out, _ = probe(first="import mlx.core as mx\nimport mlxbun_core")
    assert out["state"]["active"] == "openblas"
    assert "openblas" in os.path.basename(out["owners"]["cblas_sgemm"]).lower()


def test_reference_on_request_stays_on_the_bundled_library_quietly():
    out, stderr = probe(MLXBUN_BLAS="reference")
    assert out["state"]["active"] == "reference"
    assert os.path.basename(out["owners"]["cblas_sgemm"]).startswith("libblas")
    assert "warning" not in stderr
    assert max(out["max_error"].values()) < 1e-3


def test_no_optimized_library_warns_once_with_the_fix(tmp_path):
    out, stderr = probe(MLXBUN_BLAS=str(tmp_path / "no-such-libopenblas.so"))
    assert out["state"]["active"] == "reference"
    assert os.path.basename(out["owners"]["cblas_sgemm"]).startswith("libblas")
    assert stderr.count("reference BLAS") == 1, stderr
    assert "pip install scipy-openblas32" in stderr


def test_this_test_process_runs_on_openblas():
    import mlx.core  # noqa: F401  (the conftest's import of mlxbun_core routed it)

    from mlxbun_core import blas

    assert blas.state().active == "openblas", blas.state()


def test_serve_banner_and_stats_name_the_blas():
    with serve(tiny_checkpoint("llama", seed=3), "--no-open", ready=None) as proc:
        banner = proc.wait_for_line("BLAS", 120)  # fails, never hangs
        assert "BLAS OpenBLAS" in banner and "scipy-openblas32" in banner, banner
        stats = proc.wait_for_http(proc.base + "/stats", 30).json()
        assert stats["blas"]["active"] == "openblas"
        assert "openblas" in os.path.basename(stats["blas"]["library"]).lower()
        assert stats["blas"]["routed"] == ["cblas_sgemm", "cblas_dgemm", "cblas_cgemm"]
