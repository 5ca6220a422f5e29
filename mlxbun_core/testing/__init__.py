"""Test helpers: tiny deterministic checkpoints for CPU tests."""

from .checkpoints import (
    FAMILY_DEFAULT_EOS,
    FAMILY_SPECIAL_TOKENS,
    SUPPORTED_MODEL_TYPES,
    default_eos,
    family_config,
    tiny_checkpoint,
    tiny_reranker_checkpoint,
    write_checkpoint,
)

__all__ = [
    "FAMILY_DEFAULT_EOS",
    "FAMILY_SPECIAL_TOKENS",
    "SUPPORTED_MODEL_TYPES",
    "default_eos",
    "family_config",
    "tiny_checkpoint",
    "tiny_reranker_checkpoint",
    "write_checkpoint",
]
