"""Every test runs under a temporary ``MLXBUN_HOME``, and the run fails if the real one changed.

Loaded with :mod:`.fixtures` (the pytest plugin the root conftest names). At start-up
the plugin points ``MLXBUN_HOME`` at a fresh directory for the whole session (subprocesses
inherit it, so a spawned ``mlxbun serve`` or job child writes there too; the embedded
default is converted there once and shared), and snapshots the user's real home(s):
``$MLXBUN_HOME`` as it was and ``~/.cache/mlxbun``. When the session ends the snapshot is
taken again; any file added, removed or rewritten fails the run with the list.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

MAX_ENTRIES = 50_000  # a listing, not a backup: enough to notice a stray chat or model

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
