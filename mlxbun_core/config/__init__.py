"""``mlxbun.yaml``: serve defaults, model aliases and per-model settings in one file.

:mod:`.yamlfile` reads and checks it (errors name the file and line), :mod:`.schema`
derives the ``serve:`` keys from ``mlxbun serve``'s argparse parser, :mod:`.effective`
merges flags > environment > file > defaults and records where each value came from,
:mod:`.show` is ``mlxbun config show``, :mod:`.duration` reads Ollama-style ``keep_alive``.
"""

from .duration import FOREVER, keep_alive_arg, parse_keep_alive
from .effective import Settings, apply_config
from .yamlfile import ConfigError, ModelSettings

__all__ = ["FOREVER", "ConfigError", "ModelSettings", "Settings", "apply_config",
           "keep_alive_arg", "parse_keep_alive"]
