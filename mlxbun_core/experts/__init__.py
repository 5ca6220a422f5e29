"""Routed experts of a MoE model streamed from its checkpoint under a byte budget
(``--expert-budget``, ``--expert-offload``): :mod:`.cache` (the index of byte ranges, the
reader, the LRU) and :mod:`.streaming` (the stand-in for mlx-lm's ``SwitchGLU``)."""


class ExpertsUnsupported(ValueError):
    """``--expert-offload`` / ``--expert-budget`` for a model whose experts cannot be
    streamed (a dense model, a family that loads its own way): start-up refuses it."""
