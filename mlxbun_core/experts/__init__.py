"""Routed experts of a MoE model streamed from its checkpoint under a byte budget
(``--expert-budget``, ``--expert-offload``): :mod:`.cache` (the index of byte ranges, the
reader, the LRU) and :mod:`.streaming` (the stand-in for mlx-lm's ``SwitchGLU``)."""


from ..errors import ExpertsUnsupported

__all__ = ["ExpertsUnsupported"]
