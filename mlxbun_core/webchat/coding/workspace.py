"""The folder the coding tools may touch, and nothing outside it.

Every path the model names is resolved with ``realpath`` (``..`` and symlinks followed)
and must land inside the workspace's own realpath; a symlink inside the folder that points
out is refused like an absolute path outside. Checks happen again right before each write
(the approval may have waited minutes).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..apptools import ToolFailed

# The environment a command sees: the caller's search path, locale and user name, nothing
# else (an allow-list: MLXBUN_API_KEY, HF_TOKEN, cloud and CI credentials, proxies with
# passwords and every other variable stay out). LC_* passes too.
KEPT_ENV = ("PATH", "LANG", "TZ", "USER", "LOGNAME", "TMPDIR")


def choose(raw: object) -> Path:
    """The workspace the user named: an existing directory, given as an absolute path
    (``~`` allowed), never the filesystem root; its realpath."""
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("workspace must be the path of a folder")
    path = Path(os.path.expanduser(raw.strip()))
    if not path.is_absolute():
        raise ValueError("workspace must be an absolute path")
    real = Path(os.path.realpath(path))
    if not real.is_dir():
        raise ValueError(f"workspace {raw!r} is not a folder")
    if real == Path(real.anchor):
        raise ValueError("the filesystem root cannot be a workspace")
    return real


class Workspace:
    """One chosen folder; :meth:`resolve` turns a model's path into a real path inside it."""

    def __init__(self, root: Path):
        self.root = Path(os.path.realpath(root))

    def inside(self, real: Path) -> bool:
        return real == self.root or self.root in real.parents

    def resolve(self, raw: object, *, default: str | None = None) -> Path:
        """``raw`` (relative to the workspace, or absolute inside it) as a real path inside
        the workspace; anything that resolves outside is a :class:`ToolFailed`."""
        if raw is None and default is not None:
            raw = default
        if not isinstance(raw, str) or not raw or "\x00" in raw:
            raise ToolFailed("path must be a non-empty string")
        given = Path(raw)
        if ".." in given.parts:
            raise ToolFailed(f"path {raw!r} leaves the workspace ('..' is not allowed)")
        joined = given if given.is_absolute() else self.root / given
        real = Path(os.path.realpath(joined))
        if not self.inside(real):
            why = "is a symlink that points" if not given.is_absolute() else "is"
            raise ToolFailed(f"path {raw!r} {why} outside the workspace {self.root}")
        return real

    def relative(self, real: Path) -> str:
        return str(real.relative_to(self.root)) if real != self.root else "."

    def env(self) -> dict[str, str]:
        """A scrubbed environment: no keys, tokens or server settings leak to commands."""
        env = {k: v for k, v in os.environ.items() if k in KEPT_ENV or k.startswith("LC_")}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(HOME=str(self.root), PWD=str(self.root), TERM="dumb")
        return env
