"""Keep an installed torch out of mlxbun's processes unless something they run needs it.

mlxbun computes on MLX; transformers (tokenizers, configs, processors) imports a torch it
finds for its own torch models, which costs every ``serve`` start-up, engine child and job
2-4 s of CPU and never runs (``make serve`` installs no torch; ``make test`` does, for
xgrammar). The xgrammar backend imports torch itself; ``MLXBUN_TORCH=1`` keeps it for a
third-party plugin or job runner that does.
"""

from __future__ import annotations

import sys

from .runconfig import settled

# the optional parts that import torch themselves
NEEDS_TORCH = {"xgrammar"}


def keep_torch_out(grammar_backend: str | None = None) -> bool:
    """Hide torch from this process (importlib then finds no such module); True when it
    did. A no-op once torch or transformers is imported, or when ``grammar_backend`` (or
    ``MLXBUN_GRAMMAR_BACKEND``) is one that needs it."""
    config = settled()
    wanted = {grammar_backend, config.grammar.backend}
    if (wanted & NEEDS_TORCH or config.process.torch
            or "torch" in sys.modules or "transformers" in sys.modules):
        return False
    sys.modules["torch"] = None  # type: ignore[assignment]  # importlib's "no such module"
    return True
