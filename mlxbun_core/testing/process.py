"""A real ``mlxbun serve`` subprocess for tests, read with deadlines.

A bare ``proc.stdout.readline()`` blocks forever when the server goes silent, which
hangs the suite instead of failing a test. Here a thread drains the output (so the pipe
never fills either) and every wait has a deadline; a failure message carries what the
process printed. :func:`serve` starts ``mlxbun serve`` on a free port and waits for it,
so a test module names only its flags.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx

from .server import free_port

CLI = [sys.executable, "-m", "mlxbun_core.cli"]
"""``mlxbun`` as this interpreter runs it (this tree's code, whatever is on PATH)."""
TAIL_CHARS = 4000  # of the output, printed when a ``with`` block ends (shown on a failure)


class ServerProcess:
    def __init__(self, cmd: list, *, env: dict | None = None, preexec_fn=None,
                 port: int | None = None):
        """``preexec_fn`` runs in the child before ``cmd`` (resource limits for it alone);
        ``port``: where it listens on loopback (``base``: its URL)."""
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, preexec_fn=preexec_fn)
        self.port = port
        self.base = f"http://127.0.0.1:{port}" if port is not None else ""
        self.lines: list[str] = []  # everything printed so far
        self._read = 0  # lines wait_for_line has looked at
        self._ended = False
        self._cond = threading.Condition()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, needle: str, timeout: float) -> str:
        """The next output line containing ``needle``; AssertionError at the deadline
        or when the process ends first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                while self._read < len(self.lines):
                    line = self.lines[self._read]
                    self._read += 1
                    if needle in line:
                        return line
                if self._ended:
                    raise AssertionError(f"process ended (rc={self.proc.wait()}) before a "
                                         f"line with {needle!r}; output:\n{self.output}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line with {needle!r} within {timeout:.0f}s; "
                                         f"output so far:\n{self.output}")
                self._cond.wait(left)

    def wait_for_http(self, url: str, timeout: float) -> httpx.Response:
        """GET ``url`` until it answers (any status); AssertionError at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                return httpx.get(url, timeout=max(0.1, deadline - time.monotonic()))
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"{url} did not answer within {timeout:.0f}s "
                             f"(rc={self.proc.poll()}); output:\n{self.output}")

    def wait_until(self, check: Callable[[], object], what: str, timeout: float) -> None:
        """Call ``check`` until it is true; an HTTP error or a body that is not JSON counts
        as not yet. AssertionError when the process ends first or at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"process exited (rc={self.proc.returncode}) while "
                                     f"waiting for {what}; output:\n{self.output}")
            try:
                if check():
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out ({timeout:.0f}s) waiting for {what}; "
                                     f"output so far:\n{self.output}")
            time.sleep(0.1)

    def wait_for_engine(self, timeout: float) -> None:
        """Until ``/engine`` says ready: an ``--isolate`` parent listens (and answers
        ``/health`` 503) before its engine child has loaded."""
        self.wait_until(lambda: httpx.get(self.base + "/engine", timeout=10).json()
                        .get("state") == "ready", "a ready engine", timeout)

    def wait_for_exit(self, timeout: float) -> int:
        """The exit status, once the process has ended and what it printed last is read
        (``lines`` is then whole, unless a child of its own still holds the pipe)."""
        rc = self.proc.wait(timeout)
        with self._cond:
            self._cond.wait_for(lambda: self._ended, timeout)
        return rc

    def stop(self, timeout: float = 30):
        """SIGTERM (the server drains gracefully), then SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc):
        self.stop()
        print(self.output[-TAIL_CHARS:])


def serve(*args: object, env: dict | None = None, ready: str | None = "/health",
          timeout: float = 240, preexec_fn=None) -> ServerProcess:
    """``mlxbun serve ARGS --port P`` (``P`` a free port), started and waited for.

    ``env``: variables set over this process's environment. ``ready``: ``"/health"``
    waits until that answers at all, ``"/engine"`` until the engine says ready (an
    ``--isolate`` parent), None not at all. A server that fails to come up is stopped
    before the AssertionError (with its output) leaves."""
    port = free_port()
    proc = ServerProcess([*CLI, "serve", *map(str, args), "--port", str(port)],
                         env={**os.environ, **(env or {})}, preexec_fn=preexec_fn, port=port)
    try:
        if ready == "/engine":
            proc.wait_for_engine(timeout)
        elif ready is not None:
            proc.wait_for_http(proc.base + ready, timeout)
    except BaseException:
        proc.stop()
        raise
    return proc
