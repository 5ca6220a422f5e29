"""A real ``mlxbun serve`` subprocess for tests, read with deadlines.

A bare ``proc.stdout.readline()`` blocks forever when the server goes silent, which
hangs the suite instead of failing a test. Here a thread drains the output (so the pipe
never fills either) and every wait has a deadline; a failure message carries what the
process printed.
"""

from __future__ import annotations

import subprocess
import threading
import time

import httpx


class ServerProcess:
    def __init__(self, cmd: list, *, env: dict | None = None, preexec_fn=None):
        """``preexec_fn`` runs in the child before ``cmd`` (resource limits for it alone)."""
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, preexec_fn=preexec_fn)
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
