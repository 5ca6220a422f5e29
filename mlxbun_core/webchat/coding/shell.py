"""Run one approved command: ``bash -c`` in the workspace (or a folder inside it), with a
scrubbed environment, a timeout and an output cap, under a small supervisor process
(:mod:`.supervise`) that holds no secrets (its environment is the command's) and kills
every descendant of the command when it ends: on its own, on timeout, on abort and when
the output cap is reached, including processes that left its process group.

The command string is the model's and goes to a shell only after the user approved that
exact string on the card (which says it runs through ``bash -c``). The shell is not a
sandbox: it starts in the workspace, but an approved command can ``cd`` elsewhere and do
whatever the user could (docs/security.md, "Coding tools").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..apptools import ToolFailed
from .workspace import Workspace

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
MAX_OUTPUT_BYTES = 64 * 1024
MAX_COMMAND = 8 * 1024
SHELL = ("bash", "-c")
SUPERVISOR = (sys.executable, "-I", "-S", str(Path(__file__).with_name("supervise.py")), "--")
STOP_GRACE_S = 5.0  # for the supervisor's sweep, before it is killed itself

Chunk = Callable[[str], Awaitable[None]]


def check(ws: Workspace, args: dict) -> tuple[str, str, float]:
    """The command, the folder it runs in (relative label) and its timeout, validated."""
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolFailed("command must be a non-empty string")
    if len(command) > MAX_COMMAND or "\x00" in command:
        raise ToolFailed(f"command must be at most {MAX_COMMAND} characters, without NUL")
    cwd = ws.resolve(args.get("cwd"), default=".")
    if not cwd.is_dir():
        raise ToolFailed(f"cwd {args.get('cwd')!r} is not a folder")
    timeout = args.get("timeout", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ToolFailed("timeout must be a positive number of seconds")
    return command, ws.relative(cwd), min(float(timeout), MAX_TIMEOUT_S)


def _stop(proc: asyncio.subprocess.Process) -> None:
    """Tell the supervisor to end the command and everything it started."""
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()


async def _ended(proc: asyncio.subprocess.Process) -> None:
    """The supervisor's exit after :func:`_stop`; past the grace it is killed with its
    group (a command that stopped it could leave orphans: docs/security.md)."""
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), STOP_GRACE_S)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), STOP_GRACE_S)


async def run(ws: Workspace, args: dict, on_chunk: Chunk) -> dict:
    """Run the command; each piece of output goes to ``on_chunk`` as it comes."""
    command, where, timeout = check(ws, args)
    proc = await asyncio.create_subprocess_exec(
        *SUPERVISOR, *SHELL, command, cwd=ws.resolve(where), env=ws.env(),
        start_new_session=True, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None  # piped above
    out = bytearray()
    capped = timed_out = False

    async def pump() -> None:
        nonlocal capped
        assert proc.stdout is not None
        while piece := await proc.stdout.read(4096):
            room = MAX_OUTPUT_BYTES - len(out)
            out.extend(piece[:room])
            await on_chunk(piece[:room].decode("utf-8", "replace"))
            if len(piece) > room:
                capped = True
                _stop(proc)
                return

    try:
        await asyncio.wait_for(pump(), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    finally:  # also on abort (a cancelled turn): nothing the command started lives on
        _stop(proc)
        await _ended(proc)
    return {"exitCode": proc.returncode, "output": out.decode("utf-8", "replace"),
            "cwd": where, "timedOut": timed_out, "truncated": capped}
