"""The web chat's "always allow this tool" list: a small JSON file under ``<home>``.

Keyed by tool name, never by a call's arguments. Granting happens only through the chat's
approval card (:func:`grant`); the settings routes list and revoke. It lives here, below
the hub's settings routes, because the chat's coding tools read it on every gated call.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import BadRequest
from ..models.paths import mlxbun_home

_TOOL = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
MAX_APPROVALS = 200


def approvals_path(home: Path | None = None) -> Path:
    return mlxbun_home(home) / "tool-approvals.json"


def approvals(home: Path | None = None) -> list[str]:
    """The tools always allowed, sorted (an unreadable file: none)."""
    try:
        data = json.loads(approvals_path(home).read_text())
    except (OSError, ValueError):
        return []
    tools = data.get("alwaysAllow") if isinstance(data, dict) else None
    return sorted({t for t in tools if isinstance(t, str) and _TOOL.match(t)}) if isinstance(
        tools, list) else []


def _write(tools: list[str], home: Path | None) -> list[str]:
    path = approvals_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"alwaysAllow": sorted(set(tools))}))
    os.replace(tmp, path)
    return sorted(set(tools))


def _tool(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise BadRequest("tool required", param="tool")
    if not _TOOL.match(name):
        raise BadRequest("tool must be a tool name (letters, digits, _ . : -; at most 64)",
                         param="tool")
    return name


def grant(tool: object, home: Path | None = None) -> list[str]:
    """Always allow ``tool`` (the chat's approval card calls this)."""
    name = _tool(tool)
    current = approvals(home)
    if name not in current and len(current) >= MAX_APPROVALS:
        raise BadRequest(f"at most {MAX_APPROVALS} tools can be always allowed", param="tool")
    return _write(current + [name], home)


def revoke(tool: object, home: Path | None = None) -> list[str]:
    """Forget ``tool``'s approval; idempotent."""
    name = _tool(tool)
    return _write([t for t in approvals(home) if t != name], home)
