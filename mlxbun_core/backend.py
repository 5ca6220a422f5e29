"""Which of MLX's backends runs this process's arrays: ``metal``, ``cuda`` or ``cpu``.

Decided in one place because several choices follow from it (the default batch width,
the paged-attention kernel, whether quantized layers dequantize for wide passes)."""

from __future__ import annotations


def backend() -> str:
    """``metal``, ``cuda`` or ``cpu``: where MLX runs by default."""
    import mlx.core as mx

    if mx.default_device() != mx.gpu:
        return "cpu"
    cuda = getattr(mx, "cuda", None)
    return "cuda" if cuda is not None and cuda.is_available() else "metal"
