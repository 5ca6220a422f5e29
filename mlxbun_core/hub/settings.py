"""Settings the admin routes keep: the hub token and the tool approvals.

The token goes where ``huggingface_hub`` reads it (``$HF_HOME/token``, mode 0600),
so downloads, pushes and ``hf`` itself all use it; it is never sent back, only a
masked form. Tool approvals (the web chat's "always allow this tool") are a small
JSON file under ``<home>``; granting happens through the chat's approval card, so
this module's :func:`grant` is for that code, and the routes only list and revoke.
"""

from __future__ import annotations

import os
import re

from ..errors import BadRequest
from ..webchat import approvals as _approvals
from . import remote

TOKEN_MAX = 512
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces


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


# -- tool approvals: the store lives with the web chat, which grants; re-exported here for
# the settings routes and their callers
approvals_path, approvals, grant, revoke = (
    _approvals.approvals_path, _approvals.approvals, _approvals.grant, _approvals.revoke)
