"""Architectures this engine refuses on purpose, with the reason said at start-up.

Every model here decodes one token after another over a KV cache (mlx-lm's loop). A
checkpoint built for another generation loop is named here, so ``serve`` says what it is
and why it is not served, instead of the bare "no plugin can load it".
"""

from __future__ import annotations

from typing import Any

DIFFUSION_GEMMA = (
    "DiffusionGemma is a non-autoregressive (diffusion) language model: it denoises a "
    "fixed 256-token canvas over up to 48 bidirectional decoder passes after an encoder "
    "prefill, with its own samplers and self-conditioning. mlxbun serves autoregressive "
    "models (one token per step over a KV cache); there is no public MLX implementation "
    "of this architecture to load it with (stock mlx-lm cannot), so it is not served")

_BY_MODEL_TYPE = {"diffusion_gemma": DIFFUSION_GEMMA}
_BY_ARCHITECTURE = {"DiffusionGemma": DIFFUSION_GEMMA}  # a prefix of the class name


def refusal(config: dict[str, Any]) -> str | None:
    """Why the checkpoint with ``config`` is not served (None: nothing against it)."""
    why = _BY_MODEL_TYPE.get(str(config.get("model_type", "")))
    if why is not None:
        return why
    for arch in config.get("architectures") or []:
        for prefix, reason in _BY_ARCHITECTURE.items():
            if str(arch).startswith(prefix):
                return reason
    return None
