"""Which of MLX's backends runs this process's arrays: ``metal``, ``cuda`` or ``cpu``.

Decided in one place because several choices follow from it (the default batch width,
the paged-attention kernel, whether quantized layers dequantize for wide passes)."""

from __future__ import annotations

from pathlib import Path


def backend() -> str:
    """``metal``, ``cuda`` or ``cpu``: where MLX runs by default."""
    import mlx.core as mx

    if mx.default_device() != mx.gpu:
        return "cpu"
    cuda = getattr(mx, "cuda", None)
    return "cuda" if cuda is not None and cuda.is_available() else "metal"


PTX_CACHE_ENV = "MLX_PTX_CACHE_DIR"


def keep_compiled_kernels(home: Path, where: str | None = None) -> str | None:
    """On CUDA, where MLX keeps the kernels it compiles: mlxbun's home, not MLX's default
    under the temporary directory, which a reboot may empty (a 4-bit 8B's first start on
    an H100 compiles for 95 s before it is ready; a start that finds them takes seconds).
    Set before the first kernel is compiled (MLX reads it once); a directory the user
    named is kept, an empty one too (MLX reads that as "keep none"). ``home``: mlxbun's
    (``models.paths.mlxbun_home``). The directory set, or None."""
    import os

    import mlx.core as mx

    if (where or backend()) != "cuda" or PTX_CACHE_ENV in os.environ:
        return None
    path = str(home / "ptx" / getattr(mx, "__version__", "unknown"))
    os.environ[PTX_CACHE_ENV] = path
    return path
