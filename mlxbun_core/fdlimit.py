"""The open-file limit: as high as the system lets this process go, and kept there.

Every connection a server holds is a file descriptor, so the soft ``RLIMIT_NOFILE`` bounds
how many clients can be connected at once; past it ``accept()`` fails and nobody gets in.
:func:`install` (run when ``mlxbun_core`` is imported, so in every process: the server,
the ``--isolate`` parent and its engine children, job children) raises the soft limit to
the hard one, and keeps ``mlx_lm.utils`` from undoing it: importing that module calls
``setrlimit(RLIMIT_NOFILE, (2048, 4096))``, which lowers both limits of a process that
had more, and a lowered hard limit cannot be raised again without privileges.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys

try:
    import resource
except ImportError:  # not a POSIX system: nothing to raise
    resource = None  # type: ignore[assignment]  # the module's absence, checked below

__all__ = ["install", "raise_soft_limit", "open_file_limit"]

log = logging.getLogger("mlxbun.fdlimit")

GUARDED = "mlx_lm.utils"  # the module whose import lowers the limit
# soft limits tried when the hard one is unlimited or refused (macOS caps a process at
# kern.maxfilesperproc and refuses RLIM_INFINITY)
FALLBACKS = (1 << 20, 65536, 24576, 10240)


def open_file_limit() -> int | None:
    """The soft open-file limit now (None where there is none to read)."""
    if resource is None:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def raise_soft_limit() -> int | None:
    """Raise the soft limit to the hard one (or the highest the system accepts); the
    soft limit after."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = [hard] if hard != resource.RLIM_INFINITY else []
    wanted += [n for n in FALLBACKS if hard == resource.RLIM_INFINITY or n < hard]
    for target in wanted:
        if soft != resource.RLIM_INFINITY and target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):
            continue
    return open_file_limit()


def _keep_nofile(real):
    """``resource.setrlimit`` for the guarded import: calls for RLIMIT_NOFILE are dropped."""
    def setrlimit(which: int, limits: tuple[int, int]) -> None:
        if which == resource.RLIMIT_NOFILE:
            log.debug("kept the open-file limit that %s would set to %s", GUARDED, limits)
            return
        real(which, limits)
    return setrlimit


class _GuardImport(importlib.abc.MetaPathFinder):
    """Loads :data:`GUARDED` with ``resource.setrlimit`` unable to touch RLIMIT_NOFILE."""

    def find_spec(self, name, path=None, target=None):
        if name != GUARDED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Guarded(spec.loader)
        return spec


class _Guarded(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        real = resource.setrlimit
        resource.setrlimit = _keep_nofile(real)
        try:
            self.inner.exec_module(module)
        finally:
            resource.setrlimit = real


def install() -> None:
    """Raise the soft limit now and guard the import that would lower it."""
    if resource is None:
        return
    if GUARDED in sys.modules:  # imported before us: its limits stand; raise what we can
        log.debug("%s was imported before mlxbun_core: its open-file limit stands", GUARDED)
    elif not any(isinstance(f, _GuardImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _GuardImport())
    raise_soft_limit()
