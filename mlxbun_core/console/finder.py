"""Find a running mlxbun server for a model, or start one for the caller's session.

``mlxbun chat`` uses it (and a launcher for agent clients would too): a server already
answering on the usual port is used when it serves the model asked for (or any model,
when none is asked for; an ``--isolate`` pool when the model is one of its rows);
otherwise ``mlxbun serve MODEL`` starts on a free loopback port, its output in a log file,
and is stopped (drained) when the session ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

START_TIMEOUT_S = 15 * 60.0  # a first start may convert the embedded default or download
PROBE_TIMEOUT_S = 2.0


class NoServer(Exception):
    """No server could be found or started; the message says why."""


@dataclass
class Server:
    """A server to talk to: its base URL, the ``model`` to send, and the process when
    this session started it (None: it was running already)."""

    base_url: str
    model: str
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def started(self) -> bool:
        return self.proc is not None

    def stop(self, timeout: float = 30.0) -> None:
        """Drain and stop a server this session started (SIGTERM, then SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self._log is not None:
            self._log.close()


def default_port() -> int:
    return int(os.environ.get("MLXBUN_PORT") or 8080)


def served_rows(base_url: str) -> tuple[list[dict], bool] | None:
    """``(/v1/models rows, isolated pool?)`` of an mlxbun server at ``base_url``; None
    when nothing (or something else) answers there."""
    try:
        index = httpx.get(base_url + "/v1", timeout=PROBE_TIMEOUT_S)
        if index.status_code != 200 or index.json().get("name") != "mlxbun":
            return None
        rows = httpx.get(base_url + "/v1/models", timeout=PROBE_TIMEOUT_S * 5).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, AttributeError, TypeError):
        return None
    return [r for r in rows if isinstance(r, dict) and r.get("id")], bool(
        index.json().get("isolated"))


def pick(rows: list[dict], pool: bool, wanted: str | None) -> str | None:
    """The model id to send for ``wanted`` on a server listing ``rows`` (its served model
    first), or None when that server cannot serve it."""
    if not rows:
        return None
    if wanted is None:
        return str(rows[0]["id"])
    candidates = rows if pool else rows[:1]  # a plain server serves only its first row
    low = wanted.lower()
    for row in candidates:
        if low in (str(row["id"]).lower(), str(row.get("alias_of") or "").lower()):
            return str(row["id"])
    name = Path(wanted).name.lower()  # a directory or a query naming the served model
    return next((str(r["id"]) for r in candidates if name and name in str(r["id"]).lower()),
                None)


def find_or_start(model: str | None, *, url: str | None = None, host: str = "127.0.0.1",
                  port: int | None = None, log_dir: Path | None = None,
                  say=lambda line: print(line, file=sys.stderr, flush=True)) -> Server:
    """A server for ``model`` (see the module docstring); ``url`` names one that must be
    running. Raises :class:`NoServer`."""
    if url is not None:
        base = url.rstrip("/").removesuffix("/v1")
        found = served_rows(base)
        if found is None:
            raise NoServer(f"no mlxbun server answers at {base}")
        chosen = pick(*found, model)
        if chosen is None:
            raise NoServer(f"the server at {base} does not serve {model!r} "
                           f"(it serves {found[0][0]['id'] if found[0] else 'nothing'})")
        return Server(base, chosen)
    base = f"http://{host}:{port or default_port()}"
    found = served_rows(base)
    chosen = pick(*found, model) if found is not None else None
    if chosen is not None:
        return Server(base, chosen)
    return start(model, log_dir=log_dir, say=say)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: str | None, *, log_dir: Path | None = None, say=print) -> Server:
    """``mlxbun serve MODEL`` on a free loopback port, waited for until ``/health`` says
    ok; its output goes to ``<log_dir>/serve-<port>.log``."""
    from ..models.paths import mlxbun_home

    port = free_port()
    log_dir = log_dir or mlxbun_home() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"serve-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 (closed by Server.stop)
    argv = [sys.executable, "-m", "mlxbun_core.cli", "serve", *([model] if model else []),
            "--host", "127.0.0.1", "--port", str(port), "--no-open"]
    say(f"mlxbun: starting `mlxbun serve {model or ''}` on port {port} for this session "
        f"(log: {log_path})")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", model or "default", proc, log_path, log)
    try:
        wait_healthy(server)
    except BaseException:
        server.stop()
        raise
    rows = served_rows(server.base_url)
    if rows and rows[0]:
        server.model = str(rows[0][0]["id"])
    return server


def wait_healthy(server: Server, timeout: float = START_TIMEOUT_S) -> None:
    """Until ``/health`` answers 200; :class:`NoServer` with the log's tail if the
    process exits first (a wrong model name, a bad flag)."""
    assert server.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            tail = server.log_path.read_text(errors="replace").strip().splitlines()[-5:] \
                if server.log_path else []
            raise NoServer("the server did not start (exit status "
                           f"{server.proc.returncode}):\n  " + "\n  ".join(tail))
        try:
            if httpx.get(server.base_url + "/health", timeout=PROBE_TIMEOUT_S).status_code \
                    == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise NoServer(f"the server did not answer within {timeout:.0f} s (log: {server.log_path})")
