"""Point libmlx's BLAS imports at an optimized library.

MLX's Linux CPU wheel links Netlib's reference ``libblas`` (bundled as
``mlx_cpu.libs/libblas-*.so``) and calls ``cblas_sgemm``/``dgemm``/``cgemm`` from it for
every float matrix product: about 5 GFLOP/s where OpenBLAS does 150+. The portable
OpenBLAS on PyPI, ``scipy-openblas32`` (a dependency on Linux), exports those routines
only under a ``scipy_`` prefix, so preloading it changes nothing; instead, once libmlx is
loaded, the pointers its import table holds for the three routines are set to
OpenBLAS's (same C ABI, 32-bit integers). LAPACK calls stay on the bundled library.

Choice (``MLXBUN_BLAS``): ``auto`` (default: scipy-openblas32, else the system's
``libopenblas``), ``reference`` (leave MLX as shipped), or a path to a shared library
exporting ``cblas_sgemm`` (or ``scipy_cblas_sgemm``). ``MLXBUN_BLAS_THREADS`` sets
OpenBLAS's thread count (see :func:`default_threads`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from . import elf

ROUTED = ("cblas_sgemm", "cblas_dgemm", "cblas_cgemm")
FIX = ("pip install scipy-openblas32 (or: apt-get install libopenblas0), "
       "or set MLXBUN_BLAS to a library exporting cblas_sgemm")


@dataclass(frozen=True)
class Provider:
    """An optimized BLAS on disk and the prefix its C symbols carry."""

    path: Path
    prefix: str  # "scipy_" for scipy-openblas32, "" for a plain OpenBLAS/MKL
    source: str  # "scipy-openblas32", "system" or "MLXBUN_BLAS"


def _scipy_openblas() -> Path | None:
    spec = importlib.util.find_spec("scipy_openblas32")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        libs = sorted((Path(loc) / "lib").glob("libscipy_openblas*.so*"))
        if libs:
            return libs[0]
    return None


def find_provider(choice: str) -> Provider | None:
    """The library ``choice`` names (``auto`` or a path); None when there is none."""
    if choice not in ("", "auto"):
        path = Path(choice).expanduser()
        return Provider(path, _prefix(path), "MLXBUN_BLAS") if path.is_file() else None
    wheel = _scipy_openblas()
    if wheel is not None:
        return Provider(wheel, "scipy_", "scipy-openblas32")
    system = ctypes.util.find_library("openblas")
    return Provider(Path(system), "", "system") if system else None


def _prefix(path: Path) -> str:
    lib = ctypes.CDLL(str(path))
    return "scipy_" if hasattr(lib, "scipy_cblas_sgemm") else ""


@dataclass(frozen=True)
class Routed:
    """What the import table points at after :func:`route`."""

    library: str  # the file now serving cblas_sgemm
    name: str  # "OpenBLAS 0.3.34" (from openblas_get_config) or the file name
    kernel: str | None  # OpenBLAS's core name ("Haswell", "SkylakeX", ...)
    threads: int | None


_keep: list = []  # loaded providers stay loaded: libmlx now calls into them


def route(libmlx: Path, provider: Provider, threads: int | None = None) -> Routed:
    """Set libmlx's import slots for :data:`ROUTED` to ``provider``'s functions, with
    OpenBLAS on ``threads`` (None: its own choice)."""
    lib = ctypes.CDLL(str(provider.path), mode=ctypes.RTLD_LOCAL)
    _keep.append(lib)
    base = elf.loaded_base(libmlx)
    if base is None:
        raise RuntimeError(f"{libmlx} is not loaded in this process")
    slots = elf.import_slots(libmlx, ROUTED)
    if "cblas_sgemm" not in slots.by_name:
        raise elf.NotSupported(f"{libmlx.name} does not import cblas_sgemm")
    setter = getattr(lib, provider.prefix + "openblas_set_num_threads", None)
    if setter is not None and threads is not None:
        setter(ctypes.c_int(threads))
    for name, offsets in slots.by_name.items():
        target = ctypes.cast(getattr(lib, provider.prefix + name), ctypes.c_void_p).value
        if target is None:
            raise elf.NotSupported(f"{provider.prefix}{name} resolves to a null pointer")
        for off in offsets:
            in_relro = any(lo <= off < hi for lo, hi in slots.relro)
            elf.write_pointer(base + off, target, relro=in_relro)
    return Routed(serving(libmlx, "cblas_sgemm") or str(provider.path),
                  *_describe(lib, provider))


def default_threads(setting: int | None) -> int | None:
    """OpenBLAS threads for ``setting`` (the run configuration's ``blas_threads``, from
    ``MLXBUN_BLAS_THREADS``): a count is taken as it is, 0 (``OPENBLAS_NUM_THREADS`` is
    set) leaves OpenBLAS its own choice (None), None is one core fewer than this process
    may use.

    The spare core keeps the server's own threads (event loop, detokenizer, grammar
    masks, which run beside the forward pass) from preempting a BLAS thread: OpenBLAS
    threads meet at a barrier on every call, and one descheduled thread stalls them all
    (measured on a busy 2-core box: a 128-row product at 36 GFLOP/s on one thread,
    3-5 on two)."""
    if setting is not None:
        return setting or None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def serving(libmlx: Path, symbol: str = "cblas_sgemm") -> str | None:
    """The loaded file libmlx's calls to ``symbol`` reach right now (a structural check)."""
    base = elf.loaded_base(libmlx)
    offsets = elf.import_slots(libmlx, (symbol,)).by_name.get(symbol) if base else None
    return elf.owner(elf.read_pointer(base + offsets[0])) if offsets else None


def _describe(lib, provider: Provider) -> tuple:
    def call(name: str, restype):
        fn = getattr(lib, provider.prefix + name, None)
        if fn is None:
            return None
        fn.restype = restype
        return fn()

    config = call("openblas_get_config", ctypes.c_char_p)
    corename = call("openblas_get_corename", ctypes.c_char_p)
    threads = call("openblas_get_num_threads", ctypes.c_int)
    name = " ".join(config.decode().split()[:2]) if config else provider.path.name
    return name, corename.decode() if corename else None, threads
