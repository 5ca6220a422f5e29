"""Filesystem paths that arrive in request bodies (admin routes, jobs).

The guard decides *who* may send them (loopback or the API key); this module
decides what a path may be: a string without NUL bytes, resolved (symlinks
followed, ``..`` folded) before anything reads it, free of symlink loops, and an
existing directory of the expected shape, or for outputs a place we would not
clobber. Every failure is a :class:`~mlxbun_core.errors.BadRequest` naming the field.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from pathlib import Path

from .errors import BadRequest

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _text(value, field: str) -> str:
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{field} must be a non-empty path string", param=field)
    if "\x00" in value:
        raise BadRequest(f"{field} contains a NUL byte", param=field)
    if len(value) > 4096:
        raise BadRequest(f"{field} is too long", param=field)
    return value.strip()


def resolve(value, field: str, *, strict: bool = True) -> Path:
    """``value`` as an absolute path with every symlink followed.

    ``strict``: the path must exist. A symlink loop is refused either way.
    """
    text = _text(value, field)
    try:
        path = Path(text).expanduser().resolve(strict=strict)
    except FileNotFoundError:
        raise BadRequest(f"{field}: {text} does not exist", param=field) from None
    except RuntimeError:  # Python < 3.13 reports a loop this way
        raise BadRequest(f"{field}: {text} is a symlink loop", param=field) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadRequest(f"{field}: {text} is a symlink loop", param=field) from None
        raise BadRequest(f"{field}: {text} cannot be read ({exc.strerror})", param=field) from None
    if not strict:
        # resolve(strict=False) stops quietly at a loop; walking the parents finds it
        for p in [path, *path.parents]:
            if p.is_symlink():
                try:
                    p.resolve(strict=True)
                except (RuntimeError, OSError):
                    raise BadRequest(f"{field}: {text} passes through a symlink loop",
                                     param=field) from None
    return path


def existing_dir(value, field: str, *, needs: Iterable[Iterable[str]] = ()) -> Path:
    """An existing directory holding, for each group in ``needs``, at least one of its names."""
    path = resolve(value, field)
    if not path.is_dir():
        raise BadRequest(f"{field}: {path} is not a directory", param=field)
    for group in needs:
        group = tuple(group)
        if not any((path / name).is_file() for name in group):
            raise BadRequest(f"{field}: {path} has no {' or '.join(group)}", param=field)
    return path


def output_dir(value, field: str, *, reusable_if: Iterable[str] = ()) -> Path:
    """Where a job may write: a new path, an empty directory, or a directory that
    already holds one of ``reusable_if`` (an earlier output of the same kind)."""
    path = resolve(value, field, strict=False)
    if path.exists():
        if not path.is_dir():
            raise BadRequest(f"{field}: {path} exists and is not a directory", param=field)
        if any(path.iterdir()) and not any((path / n).exists() for n in reusable_if):
            raise BadRequest(f"{field}: {path} exists and is not empty; "
                             "choose a new directory", param=field)
    elif not path.parent.exists():
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not os.access(parent, os.W_OK):
            raise BadRequest(f"{field}: {parent} is not writable", param=field)
    return path


def check_id(value, field: str = "id") -> str:
    """A name that is safe as one path component and in an adapter spec (no ``+``/``,``)."""
    if not isinstance(value, str) or not _ID.match(value) or value.lower() == "none":
        raise BadRequest(f"{field} must be 1-128 characters of letters, digits, '.', '_' or '-' "
                         "(not starting with '.' or '-', and not 'none')", param=field)
    return value
