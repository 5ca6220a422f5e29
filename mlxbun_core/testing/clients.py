"""Real coding-agent CLIs as test clients: Claude Code, OpenAI's Codex CLI and pi from npm.

:func:`install_clients` runs ``npm install`` once into a git-ignored cache directory
of the repository (``.npm-clients/``) and reuses it while the pinned versions match;
a missing ``npm`` is an error, never a skip. :func:`run_claude` and :func:`run_codex`
run one prompt non-interactively against a server with a throwaway home (no login,
no settings of the person running the tests, no update checks, no telemetry).

:func:`long_context_options` shapes a tiny checkpoint that takes these clients'
prompts (Claude Code's is about 30k tokens with the test tokenizer) in seconds on a
CPU: one sliding-window attention layer, so prefill cost grows linearly with the
prompt instead of quadratically.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332")
CODEX = ("@openai/codex", "0.171.0")
# pi's last release that runs on Node 20 (0.75 and later want Node >= 22.19); its provider
# config (models.json, extensions) is the one the newer releases document
PI = ("@earendil-works/pi-coding-agent", "0.74.2")
CACHE_DIR = ".npm-clients"
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 120


def long_context_options() -> dict:
    """``tiny_checkpoint`` keyword arguments: a context far beyond the clients' prompts,
    one sliding-window layer (linear prefill), float32 (fast matmuls on a CPU)."""
    return {"model_type": "gemma4_text", "dtype": "float32",
            "config_overrides": {"num_hidden_layers": 1, "num_attention_heads": 1,
                                 "num_key_value_heads": 1, "layer_types": ["sliding_attention"],
                                 "sliding_window": 256}}


def _installed_version(prefix: Path, package: str) -> str | None:
    manifest = prefix / "node_modules" / package / "package.json"
    try:
        return json.loads(manifest.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None


def install_clients(root: Path) -> dict[str, Path]:
    """The ``claude``, ``codex`` and ``pi`` executables, installed under ``root/.npm-clients``
    (once; a lock keeps concurrent test runs from installing over each other)."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is required for the real-client tests (Claude Code, Codex "
                           "CLI, pi); install Node.js and npm")
    prefix = Path(root).resolve() / CACHE_DIR
    prefix.mkdir(parents=True, exist_ok=True)
    wanted = (CLAUDE_CODE, CODEX, PI)
    with open(prefix / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if any(_installed_version(prefix, name) != version for name, version in wanted):
            specs = [f"{name}@{version}" for name, version in wanted]
            done = subprocess.run([npm, "install", "--no-save", "--no-audit", "--no-fund",
                                   "--prefix", str(prefix), *specs],
                                  capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
            if done.returncode != 0:
                raise RuntimeError(f"npm install {' '.join(specs)} failed:\n"
                                   f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    bins = {"claude": prefix / "node_modules" / ".bin" / "claude",
            "codex": prefix / "node_modules" / ".bin" / "codex",
            "pi": prefix / "node_modules" / ".bin" / "pi"}
    for name, path in bins.items():
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"npm installed no runnable {name} at {path}")
    return bins


def _base_env(home: Path) -> dict:
    """A clean environment: only PATH and locale come from ours (no API keys, proxies
    or client settings of the person running the tests)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    env.update(HOME=str(home), NO_COLOR="1", TERM="dumb")
    return env


def run_claude(claude: Path, base_url: str, prompt: str, *, cwd: Path, home: Path,
               max_output_tokens: int = 256, args: tuple = (),
               env: dict | None = None) -> subprocess.CompletedProcess:
    """``claude -p PROMPT --output-format json`` against ``base_url``: any API key logs
    in; auto-update, telemetry and other non-essential traffic are off. ``env`` adds
    variables (``CLAUDE_CODE_ENTRYPOINT`` names the entry point it reports)."""
    extra = env or {}
    env = _base_env(home)
    env.update(ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="mlxbun-test",
               DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
               CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(max_output_tokens), **extra)
    return subprocess.run([str(claude), "-p", prompt, "--output-format", "json", *args],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)


def codex_config(base_url: str) -> str:
    """``config.toml``: a custom provider on the Responses wire (no key: our server
    has none)."""
    return (f'model = "mlxbun-test"\nmodel_provider = "mlxbun"\n\n'
            f'[model_providers.mlxbun]\nname = "mlxbun"\nbase_url = "{base_url}"\n'
            f'wire_api = "responses"\n')


def run_codex(codex: Path, v1_url: str, prompt: str, *, cwd: Path, home: Path,
              args: tuple = ()) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``codex exec --json PROMPT`` with its own ``CODEX_HOME``; returns the process and
    its JSONL events."""
    env = _base_env(home)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(v1_url), encoding="utf-8")
    env["CODEX_HOME"] = str(codex_home)
    done = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "--json", *args, prompt],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    events = []
    for line in done.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a banner line, not an event
    return done, events
