"""Every test runs under a temporary ``MLXBUN_HOME``, and the run fails if the real one changed.

Loaded with :mod:`.fixtures` (the pytest plugin the root conftest names). At start-up
the plugin points ``MLXBUN_HOME`` at a fresh directory for the whole session (subprocesses
inherit it, so a spawned ``mlxbun serve`` or job child writes there too; the embedded
default is converted there once and shared), and snapshots the user's real home(s):
``$MLXBUN_HOME`` as it was and ``~/.cache/mlxbun``. When the session ends the snapshot is
taken again; any file added, removed or rewritten fails the run with the list.

Under pytest-xdist every worker is a session of its own, with its own home; the
controller's home (``MLXBUN_TEST_RUN_HOME``) is where :func:`default_conversion` converts
the embedded default once for all of them (a file lock), and each worker's home gets
hard links to it: one conversion per run, not one per worker.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

MAX_ENTRIES = 50_000  # a listing, not a backup: enough to notice a stray chat or model
RUN_HOME = "MLXBUN_TEST_RUN_HOME"  # the home of the run's first process (xdist: the controller)

_guarded: dict[Path, dict] = {}
_session_home: list[Path] = []


def real_homes() -> list[Path]:
    """The homes a user's mlxbun would write: ``$MLXBUN_HOME`` and the default."""
    homes = [Path.home() / ".cache" / "mlxbun"]
    if os.environ.get("MLXBUN_HOME"):
        homes.insert(0, Path(os.environ["MLXBUN_HOME"]))
    out: list[Path] = []
    for h in homes:
        if h.resolve() not in [o.resolve() for o in out]:
            out.append(h)
    return out


def snapshot(root: Path) -> dict:
    """``{relative path: (size, mtime_ns)}`` (directories: ``None``) under ``root``."""
    out: dict = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = None
        for f in filenames:
            try:
                st = os.stat(os.path.join(dirpath, f), follow_symlinks=False)
            except OSError:
                continue
            out[os.path.normpath(os.path.join(rel, f))] = (st.st_size, st.st_mtime_ns)
        if len(out) > MAX_ENTRIES:
            break
    return out


def changes(before: dict, after: dict) -> list[str]:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return ([f"added    {p}" for p in added] + [f"removed  {p}" for p in removed]
            + [f"modified {p}" for p in changed])


def pytest_configure(config) -> None:
    if _session_home:  # configured already (a nested pytest.main in one process)
        return
    for home in real_homes():
        _guarded[home] = snapshot(home)
    home = Path(tempfile.mkdtemp(prefix="mlxbun-test-home-"))
    _session_home.append(home)
    os.environ["MLXBUN_HOME"] = str(home)
    if not hasattr(config, "workerinput"):  # not an xdist worker: the workers inherit this
        os.environ[RUN_HOME] = str(home)


def default_conversion() -> Path:
    """The embedded default converted into this session's home. An xdist worker takes hard
    links to the conversion in the run's home (made there once, under a lock) instead of
    converting it again: 7 s of CPU and 500 MB per worker."""
    from ..models.resolve import mlxbun_home, resolve_model

    run_home = Path(os.environ.get(RUN_HOME) or mlxbun_home())
    if run_home.is_dir() and run_home.resolve() != mlxbun_home().resolve():
        with open(run_home / ".default-conversion.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            shared = resolve_model(None, cache_dir=run_home, progress=False).path
        own = mlxbun_home() / "converted" / shared.name
        if not own.exists():
            part = own.with_name(own.name + f".part-{os.getpid()}")
            shutil.copytree(shared, part, copy_function=os.link)
            part.rename(own)
    return resolve_model(None, progress=False).path


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    report = []
    for home, before in _guarded.items():
        diff = changes(before, snapshot(home))
        if diff:
            report.append(f"{home}:\n  " + "\n  ".join(diff[:50])
                          + (f"\n  ... and {len(diff) - 50} more" if len(diff) > 50 else ""))
    if report:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = ("the test run changed the real mlxbun home (every test must use the session's "
                "temporary MLXBUN_HOME):\n" + "\n".join(report))
        if reporter is not None:
            reporter.write_sep("=", "real mlxbun home changed", red=True)
            reporter.write_line(text)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config) -> None:
    for home in _session_home:
        shutil.rmtree(home, ignore_errors=True)
    _session_home.clear()
