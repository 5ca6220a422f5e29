"""Run one approved command and let nothing it started outlive it.

:mod:`.shell` starts this file as a script, ``python -I -S supervise.py -- bash -c CMD``,
with the command's scrubbed environment (so the command's ``$PPID`` holds no secret: its
``/proc/$PPID/environ`` is that environment) and a pipe from the server as stdin. On Linux
the supervisor becomes a child subreaper, so every descendant whose parent dies is
re-parented here, even one that left the process group (``setsid``) or double-forked.
The command runs in its own process group. When it ends, or when the server closes the
pipe (a timeout, the output cap, a stopped turn, or the server itself gone), every
descendant found is killed and reaped, and the supervisor exits with the command's status
(128 + N for a command ended by signal N).

Stdlib only, no import of mlxbun: it runs with ``-I -S`` (no site packages, no
``PYTHON*`` variables). Without a subreaper (macOS) it kills the process group and the
descendants still attached; a daemon that detached is not found there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SWEEPS = 200  # kill passes, 10 ms apart: children re-parented by one pass die in the next

_stop = False


def become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parents() -> dict[int, int]:
    """Every process's parent: from /proc, else from ``ps``."""
    out: dict[int, int] = {}
    if os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                out[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        return out
    import subprocess  # only here: it costs a tenth of the start on a busy machine

    ps = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True,
                        check=False)
    for row in ps.stdout.splitlines():
        pid, _, ppid = row.strip().partition(" ")
        if pid.isdigit() and ppid.strip().isdigit():
            out[int(pid)] = int(ppid)
    return out


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def reap(statuses: dict[int, int]) -> None:
    """Collect every child that has ended, without waiting."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def kill_all(group: int, statuses: dict[int, int]) -> None:
    """The command's process group, then every descendant, until none is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    for _ in range(SWEEPS):
        reap(statuses)
        found = descendants(os.getpid())
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def spawn(command: list[str]) -> int:
    """Start ``command`` in a session (and process group) of its own, stdin from
    /dev/null, stdout and stderr the supervisor's (the pipe to the server)."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(command[0], command)
    except OSError as exc:
        os.write(2, f"cannot run {command[0]}: {exc}\n".encode())
    os._exit(127)


def wait(child: int, statuses: dict[int, int]) -> None:
    """Until the command ends, or the server closes stdin (or sends a signal)."""
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(child)
        except OSError:
            pidfd = None
    watched = [0] + ([pidfd] if pidfd is not None else [])
    poll = 0.5 if pidfd is not None else 0.05  # without a pidfd, an end is polled for
    while not _stop and child not in statuses:
        ready, _, _ = select.select(watched, [], [], poll)
        if 0 in ready and not os.read(0, 4096):
            return  # EOF: the server is done with this command (or gone)
        reap(statuses)  # the command, and orphans that ended on their own


def _on_signal(signum: int, frame: object) -> None:
    global _stop
    _stop = True


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:]
    become_subreaper()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)  # a handler, not SIG_IGN, which exec would keep
    child = spawn(command)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # the output pipe is the command's alone now: it ends when they do
    os.dup2(quiet, 2)
    statuses: dict[int, int] = {}
    wait(child, statuses)
    kill_all(child, statuses)
    status = statuses.get(child)
    if status is None:
        return 128 + signal.SIGKILL
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
