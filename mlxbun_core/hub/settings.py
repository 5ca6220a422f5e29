"""Settings the admin routes keep: the hub token and the tool approvals.

The token goes where ``huggingface_hub`` reads it (``$HF_HOME/token``, mode 0600),
so downloads, pushes and ``hf`` itself all use it; it is never sent back, only a
masked form. Tool approvals (the web chat's "always allow this tool") are a small
JSON file under ``<home>``; granting happens through the chat's approval card, so
this module's :func:`grant` is for that code, and the routes only list and revoke.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import BadRequest
from ..models.paths import mlxbun_home
from . import remote

TOKEN_MAX = 512
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces
_TOOL = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
MAX_APPROVALS = 200


def mask(token: str) -> str:
    return f"{token[:3]}…{token[-4:]}" if len(token) > 10 else "…"


def token_state() -> dict[str, object]:
    """``{ok, hasToken, masked, source}``: where the token comes from, never the token."""
    env = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    tok = remote.token()
    source = "env" if env else "file" if tok else None
    return {"ok": True, "hasToken": tok is not None, "masked": mask(tok) if tok else None,
            "source": source}


def save_token(token: object) -> dict[str, object]:
    if not isinstance(token, str) or not token.strip():
        raise BadRequest("token required", param="token")
    token = token.strip()
    if len(token) > TOKEN_MAX or not _TOKEN.match(token):
        raise BadRequest("token must be printable ASCII without spaces, at most "
                         f"{TOKEN_MAX} characters", param="token")
    path = remote.token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return {"ok": True, "hasToken": True, "masked": mask(token)}


def forget_token() -> dict[str, object]:
    remote.token_path().unlink(missing_ok=True)
    return token_state()


# -- tool approvals ---------------------------------------------------------------------
def approvals_path(home: Path | None = None) -> Path:
    return mlxbun_home(home) / "tool-approvals.json"


def approvals(home: Path | None = None) -> list[str]:
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
