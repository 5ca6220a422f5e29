"""Streamed experts moved to the core (:mod:`mlxbun_core.experts.streaming`); kept here for
existing imports."""

from mlxbun_core.experts.streaming import StreamedSwitchGLU, Streaming, install, load_streamed

__all__ = ["StreamedSwitchGLU", "Streaming", "install", "load_streamed"]
