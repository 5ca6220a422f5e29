"""Streamed experts moved to the core (:mod:`mlxbun_core.experts.cache`), where every MoE
family mlx-lm builds with ``SwitchGLU`` can use them; kept here for existing imports."""

from mlxbun_core.experts.cache import (
    CacheStats,
    ExpertCache,
    ExpertIndex,
    ExpertReader,
    Slice,
    to_mlx,
)

__all__ = ["CacheStats", "ExpertCache", "ExpertIndex", "ExpertReader", "Slice", "to_mlx"]
