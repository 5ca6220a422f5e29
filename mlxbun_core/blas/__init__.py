"""Which BLAS MLX's CPU matrix products use, and switching it to an optimized one.

``mlxbun_core`` calls :func:`install` on import: the moment ``mlx.core`` is imported
(or at once, if it already is), a Linux CPU build of MLX has its ``cblas_*gemm``
calls routed to OpenBLAS (see :mod:`.route`). :func:`state` is what ``/stats`` reports
as ``blas`` and :func:`banner` the start-up line. macOS (Accelerate) and CUDA (the GPU
does the products) are left alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from dataclasses import asdict, dataclass

from ..runconfig import settled

__all__ = ["BlasState", "install", "state", "banner"]

log = logging.getLogger("mlxbun.blas")


@dataclass(frozen=True)
class BlasState:
    """``active``: ``openblas`` (routed), ``reference`` (MLX's bundled Netlib BLAS),
    ``accelerate`` (macOS), ``gpu`` (CUDA: not used), ``pending`` (MLX not imported yet)."""

    active: str
    name: str
    library: str | None = None
    source: str | None = None  # scipy-openblas32, system, MLXBUN_BLAS
    kernel: str | None = None
    threads: int | None = None
    routed: tuple = ()
    note: str | None = None

    def describe(self) -> dict:
        d = asdict(self)
        d["routed"] = list(self.routed)
        return d


_state = BlasState("pending", "not decided: MLX is not imported yet")
_lock = threading.Lock()


def state() -> BlasState:
    return _state


def banner() -> str:
    """One line for the start-up banner."""
    s = _state
    if s.active == "openblas":
        threads = s.threads and f"{s.threads} thread{'s' if s.threads > 1 else ''}"
        extra = ", ".join(x for x in (s.source, s.kernel, threads) if x)
        return f"BLAS {s.name} ({extra})"
    if s.active == "reference":
        return f"BLAS reference (slow){': ' + s.note if s.note else ''}"
    return f"BLAS {s.name}"


def _decide() -> BlasState:
    """Route if this is a Linux CPU build of MLX; the state either way."""
    if sys.platform == "darwin":
        return BlasState("accelerate", "Accelerate (MLX on macOS)")
    if not sys.platform.startswith("linux"):
        return BlasState("reference", "as shipped by MLX", note=f"{sys.platform}: not routed")
    import mlx.core as mx

    if mx.is_available(mx.gpu):
        return BlasState("gpu", "not used: matrix products run on the GPU (CUDA)")
    from . import elf, route

    libmlx = elf.loaded_library("/libmlx.so")
    choice, threads = settled().process.blas, settled().process.blas_threads
    reference = route.serving(libmlx) if libmlx is not None else None
    if choice == "reference":
        return BlasState("reference", "reference", reference, note="MLXBUN_BLAS=reference")
    provider = route.find_provider(choice)
    if libmlx is None or provider is None:
        why = "libmlx.so is not loaded" if libmlx is None else (
            f"MLXBUN_BLAS={choice} is not a file" if choice not in ("", "auto")
            else "no optimized BLAS found")
        return BlasState("reference", "reference", reference, note=f"{why}. Fix: {route.FIX}")
    try:
        r = route.route(libmlx, provider, route.default_threads(threads))
    except Exception as exc:  # an unexpected libmlx layout: stay on what MLX ships
        log.debug("BLAS routing failed", exc_info=True)
        return BlasState("reference", "reference", reference,
                         note=f"routing to {provider.path.name} failed ({exc})")
    return BlasState("openblas", r.name, r.library, provider.source, r.kernel, r.threads,
                     route.ROUTED)


def _activate() -> None:
    global _state
    with _lock:
        if _state.active != "pending":
            return
        _state = _decide()
    asked = settled().process.blas == "reference"
    if _state.active == "reference" and not asked and not os.environ.get("MLXBUN_BLAS_WARNED"):
        os.environ["MLXBUN_BLAS_WARNED"] = "1"  # children (jobs, --isolate engines) stay quiet
        print(f"mlxbun: warning: MLX's CPU matrix products use the slow reference BLAS "
              f"({_state.note})", file=sys.stderr, flush=True)


class _AfterMlxCore(importlib.abc.MetaPathFinder):
    """Runs :func:`_activate` right after ``mlx.core`` is loaded, before it does any work."""

    def find_spec(self, name, path=None, target=None):
        if name != "mlx.core":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader)
        return spec


class _Then(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def __getattr__(self, name):  # get_filename, is_package, ... of the real loader
        return getattr(self.inner, name)

    def exec_module(self, module):
        self.inner.exec_module(module)
        try:
            _activate()
        except Exception:  # never let the BLAS choice break importing MLX
            log.warning("could not choose a BLAS", exc_info=True)


def install() -> None:
    """Route now if ``mlx.core`` is loaded, else as soon as it is."""
    if "mlx.core" in sys.modules:
        _activate()
    elif not any(isinstance(f, _AfterMlxCore) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterMlxCore())
