"""pi (``@earendil-works/pi-coding-agent``) on mlxbun: its provider config, which
``mlxbun launch pi`` (this package), ``mlxbun pi`` (``pi_verb.py``) and ``mlxbun harness pi``
(``pi_harness.py``) share.

- ``mlxbun launch pi`` runs pi with a throwaway config dir (``PI_CODING_AGENT_DIR``) whose
  ``models.json`` names our server as the ``mlxbun`` provider on the Chat Completions wire,
  the served model under its real name with its window, and whose ``settings.json`` makes
  it the default; sessions go to ``<home>/pi-sessions`` so ``-c`` finds the last one.
- ``mlxbun pi`` is the spec's verb in front of that: its few flags map onto pi's own.
- ``mlxbun harness pi`` writes one file into the user's own pi, an extension that registers
  the same provider with the models read live from ``/v1/models`` at pi's start-up.

The ``/adapter`` command (LoRA adapters from pi) is a second extension,
``pi-extensions/mlxbun-adapter.ts``: ``mlxbun launch pi`` puts it in its throwaway config
dir, ``mlxbun harness pi --adapter`` in the user's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..console.finder import Server

PROVIDER = "mlxbun"
DEFAULT_MAX_TOKENS = 16_384  # pi's own default for a model's output cap
# our server has no developer role, no reasoning_effort switch and no `store`; it takes
# the classic max_tokens field (pi guesses these per URL, wrongly for a local one)
COMPAT = {"supportsDeveloperRole": False, "supportsReasoningEffort": False,
          "supportsStore": False, "maxTokensField": "max_tokens"}
NO_PHONING_HOME = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
EXTENSION_NAME = "mlxbun-provider.ts"
EXTENSION_MARK = "// Written by `mlxbun harness pi`"
ADAPTER_EXTENSION_NAME = "mlxbun-adapter.ts"
ADAPTER_SOURCE = Path(__file__).with_name("pi-extensions") / ADAPTER_EXTENSION_NAME
ADAPTER_URL_LINE = 'const DEFAULT_URL = "http://127.0.0.1:8080";'


def model_entry(model: str, context_window: int | None) -> dict[str, Any]:
    """One ``models.json`` model: the real name, its window, an output cap inside it."""
    entry: dict[str, Any] = {"id": model, "name": model, "input": ["text"], "reasoning": False,
                             "cost": {"input": 0, "output": 0, "cacheRead": 0,
                                      "cacheWrite": 0}}
    if context_window:
        entry["contextWindow"] = int(context_window)
        entry["maxTokens"] = min(DEFAULT_MAX_TOKENS, max(int(context_window) // 4, 256))
    return entry


def models_json(server: Server) -> dict[str, Any]:
    """pi's ``models.json`` naming ``server`` as the ``mlxbun`` provider."""
    return {"providers": {PROVIDER: {
        "name": "mlxbun", "baseUrl": server.base_url + "/v1", "api": "openai-completions",
        "apiKey": server.api_key or PROVIDER, "compat": COMPAT,
        "models": [model_entry(server.model, server.context_window)]}}}


def adapter_extension_text(server_url: str) -> str:
    """The ``/adapter`` extension with ``server_url`` (no ``/v1``) as its default server
    (``MLXBUN_URL`` still wins when pi runs)."""
    source = ADAPTER_SOURCE.read_text(encoding="utf-8")
    if ADAPTER_URL_LINE not in source:
        raise RuntimeError(f"{ADAPTER_SOURCE}: its DEFAULT_URL line moved")
    return source.replace(ADAPTER_URL_LINE, f"const DEFAULT_URL = {json.dumps(server_url)};")


def agent_dir(server: Server, root: Path) -> dict[str, str]:
    """A throwaway pi config dir under ``root`` for ``server`` (the user's ``~/.pi`` is
    never read or written); the environment that points pi at it."""
    from ..models.paths import mlxbun_home

    home = root / "pi-agent"
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.json").write_text(json.dumps(models_json(server), indent=2),
                                      encoding="utf-8")
    os.chmod(home / "models.json", 0o600)  # it may hold the server's API key
    settings = {"defaultProvider": PROVIDER, "defaultModel": server.model,
                "enableInstallTelemetry": False}
    (home / "settings.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    extensions = home / "extensions"
    extensions.mkdir(exist_ok=True)
    (extensions / ADAPTER_EXTENSION_NAME).write_text(adapter_extension_text(server.base_url),
                                                     encoding="utf-8")
    sessions = mlxbun_home() / "pi-sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    # /adapter's calls go to this server (not one a MLXBUN_URL of the user's names)
    env = {"MLXBUN_URL": server.base_url}
    if server.api_key:
        env["MLXBUN_API_KEY"] = server.api_key
    return {"PI_CODING_AGENT_DIR": str(home), "PI_CODING_AGENT_SESSION_DIR": str(sessions),
            **env, **NO_PHONING_HOME}
