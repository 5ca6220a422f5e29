"""``mlxbun harness pi [--base-url URL] [--adapter] [--remove]``: connect your own pi.

Writes one file, ``<pi config dir>/extensions/mlxbun-provider.ts`` (the config dir is
``PI_CODING_AGENT_DIR``, else ``~/.pi/agent``): a pi extension that registers the
``mlxbun`` provider. It reads the served models from ``/v1/models`` each time pi starts,
and falls back to the list read at install time when the server is down. ``--adapter``
adds ``mlxbun-adapter.ts``, pi's ``/adapter`` command, pointed at the same server (a
later plain install refreshes it too). Nothing else of the user's pi config is read or
changed; ``--remove`` deletes both files again (``--remove --adapter``: the second only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from .pi import (
    ADAPTER_EXTENSION_NAME,
    COMPAT,
    EXTENSION_MARK,
    EXTENSION_NAME,
    PROVIDER,
    model_entry,
)

EXTENSION = """\
{mark}; `mlxbun harness pi --remove` deletes it.
// Registers the mlxbun server as pi's "{provider}" provider: `pi --provider {provider}`.
// The models are read from {base_url}/models when pi starts (the server's
// MLXBUN_API_KEY, when it has one, is read from the environment); while the server is
// down, the list read at install time stands in.
import type {{ ExtensionAPI }} from "@earendil-works/pi-coding-agent";

const BASE_URL = {base_url_json};
const COMPAT = {compat};
const FALLBACK = {fallback};

type Row = {{ id: string; context_window?: number | null }};

function entry(id: string, window?: number | null) {{
  const model: Record<string, unknown> = {{
    id, name: id, input: ["text"], reasoning: false,
    cost: {{ input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }},
  }};
  if (window) {{
    model.contextWindow = window;
    model.maxTokens = Math.min({max_tokens}, Math.max(Math.floor(window / 4), 256));
  }}
  return model;
}}

async function served(key: string | undefined) {{
  try {{
    const headers: Record<string, string> = key ? {{ Authorization: `Bearer ${{key}}` }} : {{}};
    const signal = AbortSignal.timeout(3000);
    const answer = await fetch(`${{BASE_URL}}/models`, {{ headers, signal }});
    if (!answer.ok) return FALLBACK;
    const body = (await answer.json()) as {{ data?: Row[] }};
    const rows = (body.data ?? []).filter((row) => row && typeof row.id === "string");
    return rows.length ? rows.map((row) => entry(row.id, row.context_window)) : FALLBACK;
  }} catch {{
    return FALLBACK;
  }}
}}

export default async function (pi: ExtensionAPI) {{
  const key = process.env.MLXBUN_API_KEY || undefined;
  const models = await served(key);
  if (!models.length) return; // no server now and none at install time: nothing to offer
  pi.registerProvider("{provider}", {{
    baseUrl: BASE_URL, apiKey: key ?? "{provider}", api: "openai-completions",
    compat: COMPAT, models,
  }} as any);
}}
"""


def pi_config_dir() -> Path:
    """pi's config dir: ``PI_CODING_AGENT_DIR`` as pi reads it, else ``~/.pi/agent``."""
    configured = os.environ.get("PI_CODING_AGENT_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".pi" / "agent"


def extension_path() -> Path:
    return pi_config_dir() / "extensions" / EXTENSION_NAME


def adapter_extension_path() -> Path:
    return pi_config_dir() / "extensions" / ADAPTER_EXTENSION_NAME


def v1_url(base_url: str | None) -> str:
    """``--base-url`` (with or without ``/v1``), else the server the serve settings
    (``mlxbun.yaml``, ``MLXBUN_HOST``/``MLXBUN_PORT``) point at."""
    if base_url is None:
        from ..console.finder import base_url as url_of
        from . import serve_settings

        settings = serve_settings([])
        base_url = url_of(settings.host, settings.port)
    base_url = base_url.rstrip("/")
    return base_url if base_url.endswith("/v1") else base_url + "/v1"


def served_models(v1: str) -> list[dict[str, object]]:
    """What the server at ``v1`` serves now, as pi model entries (empty: no answer)."""
    import httpx

    key = os.environ.get("MLXBUN_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        rows = httpx.get(f"{v1}/models", headers=headers, timeout=5).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    return [model_entry(str(r["id"]), r.get("context_window")) for r in rows
            if isinstance(r, dict) and r.get("id")]


def extension_text(v1: str, fallback: list[dict[str, object]]) -> str:
    from .pi import DEFAULT_MAX_TOKENS

    return EXTENSION.format(mark=EXTENSION_MARK, provider=PROVIDER, base_url=v1,
                            base_url_json=json.dumps(v1), compat=json.dumps(COMPAT),
                            fallback=json.dumps(fallback), max_tokens=DEFAULT_MAX_TOKENS)


def ours(path: Path) -> bool:
    try:
        return path.read_text(encoding="utf-8").startswith(EXTENSION_MARK)
    except OSError:
        return False


def foreign(paths: list[Path]) -> Path | None:
    """The first of ``paths`` that exists and is not ours (never written over or removed)."""
    return next((p for p in paths if p.exists() and not ours(p)), None)


def remove(paths: list[Path]) -> int:
    present = [p for p in paths if p.exists()]
    if not present:
        print(f"mlxbun: nothing to remove (no {' nor '.join(map(str, paths))})")
    for path in present:
        path.unlink()
        print(f"removed {path}")
    return 0


def install(v1: str, with_adapter: bool) -> None:
    """The provider extension, and the ``/adapter`` one when asked or already there."""
    from .pi import adapter_extension_text

    fallback = served_models(v1)
    path = extension_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(extension_text(v1, fallback), encoding="utf-8")
    print(f"wrote {path}: pi's `{PROVIDER}` provider at {v1}")
    if with_adapter:
        adapter = adapter_extension_path()
        adapter.write_text(adapter_extension_text(v1.removesuffix("/v1")), encoding="utf-8")
        print(f"wrote {adapter}: pi's /adapter command (list, <id>, off)")
    if fallback:
        print(f"serving now: {', '.join(str(m['id']) for m in fallback)}")
    else:
        print(f"note: no server answers at {v1} now; pi reads its models when it starts "
              "(start one with `mlxbun serve`)")


def cmd_harness(args: argparse.Namespace) -> int:
    adapter = adapter_extension_path()
    paths = [adapter] if args.remove and args.adapter else [extension_path(), adapter]
    mine = foreign(paths)
    if mine is not None:
        print(f"mlxbun: {mine} is not one `mlxbun harness pi` wrote; left as it is",
              file=sys.stderr)
        return 2
    if args.remove:
        return remove(paths)
    install(v1_url(args.base_url), args.adapter or adapter.exists())
    print(f"run: pi --provider {PROVIDER}    (undo: mlxbun harness pi --remove)")
    if shutil.which("pi") is None:
        print("note: pi is not on PATH; install it with:\n"
              "  npm install -g @earendil-works/pi-coding-agent")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    h = sub.add_parser("harness", help="connect your own pi to mlxbun (one reversible "
                                       "extension file in pi's config dir)",
                       description="Write (or with --remove delete) "
                                   f"<pi config dir>/extensions/{EXTENSION_NAME}: it "
                                   "registers mlxbun as pi's provider, reading the served "
                                   "models from /v1/models when pi starts; with --adapter "
                                   f"also {ADAPTER_EXTENSION_NAME}, the /adapter command. The "
                                   "config dir is $PI_CODING_AGENT_DIR, else ~/.pi/agent.")
    h.add_argument("agent", choices=["pi"])
    h.add_argument("--base-url", default=None,
                   help="the server's URL (default: the one MLXBUN_HOST/MLXBUN_PORT and "
                        "mlxbun.yaml point at, http://127.0.0.1:8080/v1 unset)")
    h.add_argument("--adapter", action="store_true",
                   help=f"also write {ADAPTER_EXTENSION_NAME}, pi's /adapter command (pick a "
                        "LoRA adapter from pi); with --remove, delete only that one")
    h.add_argument("--remove", action="store_true",
                   help="delete the extensions this command wrote")
    h.set_defaults(handler=cmd_harness)
