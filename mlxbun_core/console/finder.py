"""Find a running mlxbun server for a model, or start one for the caller's session: the
one way ``mlxbun chat`` and ``mlxbun launch`` both do it.

:func:`probe` asks a URL's ``/health``, ``GET /v1`` and ``/v1/models`` (with the API key,
when there is one): None when nothing listens; :class:`NoServer` saying why when
something answers that cannot be used (it wants a key, is not ready, is no mlxbun server,
serves another model); else the :class:`Server`, naming the row to send. A server serves
its first row, and any row already resident (an ``--isolate`` pool: all of its rows).
:func:`start` runs ``mlxbun serve ARGS`` in its own session (the caller's Ctrl-C never
reaches it), its output appended to a log under ``<home>/logs/``, and waits until it
answers; :meth:`Server.stop` drains and stops a server the session started.
:func:`find_or_start` is ``mlxbun chat``'s policy: the usual port's server when it serves
the model, else a fresh one on a free loopback port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 15 * 60.0  # a first start may convert the embedded default or download
STOP_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 2.0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class NoServer(Exception):
    """No server could be found or started; the message says why, ``status`` is the exit
    status (2: the command line names a server that cannot be used)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


@dataclass
class Server:
    """A server to talk to: its base URL (no ``/v1``), the ``model`` id to send, its
    context window, the API key it takes, and the process and its log when this session
    started it (None: it was running already)."""

    base_url: str
    model: str
    context_window: int | None = None
    api_key: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def started(self) -> bool:
        return self.proc is not None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Drain and stop a server this session started (SIGTERM, then SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)


def default_port() -> int:
    return int(os.environ.get("MLXBUN_PORT") or 8080)


def base_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches ``host:port`` at."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"  # every interface: loopback is one of them
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def probe(url: str, api_key: str | None = None, wanted: str | None = None) -> Server | None:
    """The mlxbun server at ``url`` serving ``wanted`` (None: its own model); None when
    nothing listens there, :class:`NoServer` when what answers cannot be used."""
    import httpx  # here: every verb's parser imports this module, few verbs probe

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        health = httpx.get(f"{url}/health", headers=headers, timeout=PROBE_TIMEOUT_S * 2)
    except httpx.TransportError:
        return None
    index, rows, models_status = _describe(url, headers)
    if health.status_code == 401 or models_status == 401:
        raise NoServer(f"the server at {url} wants an API key: pass --api-key KEY (or set "
                       "MLXBUN_API_KEY)", 2)
    if health.status_code == 503:
        raise NoServer(f"the server at {url} is not ready ({health.text.strip()[:200]})")
    if health.status_code != 200 or index.get("name") != "mlxbun" or not rows:
        raise NoServer(f"{url} answers, but not as an mlxbun server (HTTP "
                       f"{health.status_code}); stop it or pick another --port", 2)
    row = pick(rows, bool(index.get("isolated")), wanted)
    if row is None:
        raise NoServer(f"the server at {url} does not serve {wanted!r} (it serves "
                       f"{rows[0].get('id')}); stop it, or pick another --port to start "
                       "one for it", 2)
    return Server(url, str(row["id"]), row.get("context_window"), api_key)


def _describe(url: str, headers: dict[str, str]
              ) -> tuple[dict[str, Any], list[dict[str, Any]], int | None]:
    """``GET /v1``'s index, ``/v1/models``' rows and that answer's status (empty when
    either does not answer as JSON)."""
    import httpx

    try:
        index = httpx.get(f"{url}/v1", headers=headers, timeout=PROBE_TIMEOUT_S).json()
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=PROBE_TIMEOUT_S * 5)
        data = models.json().get("data") if models.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return {}, [], None
    rows = [r for r in data if isinstance(r, dict) and r.get("id")] \
        if isinstance(data, list) else []
    return (index if isinstance(index, dict) else {}), rows, models.status_code


def pick(rows: list[dict[str, Any]], pool: bool, wanted: str | None) -> dict[str, Any] | None:
    """The row to send for ``wanted`` on a server listing ``rows`` (its served model
    first): by id or alias, then by a directory's or query's name; None when that server
    cannot serve it now (a plain server serves its first row and resident ones)."""
    if not rows:
        return None
    if not wanted:
        return rows[0]
    candidates = rows if pool else [r for i, r in enumerate(rows)
                                    if i == 0 or r.get("state") == "resident"]
    names = {wanted.lower(), Path(wanted).name.lower()} - {""}
    for row in candidates:
        if names & {str(row["id"]).lower(), str(row.get("alias_of") or "").lower()}:
            return row
    name = Path(wanted).name.lower()
    return next((r for r in candidates if name and name in str(r["id"]).lower()), None)


def log_file(name: str) -> Path:
    """``<home>/logs/NAME`` (the folder made)."""
    from ..models.paths import mlxbun_home

    folder = mlxbun_home() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def start(serve_args: list[str], port: int, *, host: str = "127.0.0.1",
          api_key: str | None = None, log: Path | None = None,
          say: Callable[[str], None] = _stderr, timeout: float = START_TIMEOUT_S) -> Server:
    """``mlxbun serve SERVE_ARGS`` (which put it on ``host:port``) in its own session,
    its output appended to ``log`` (default ``<home>/logs/serve-PORT.log``), waited for
    until it answers; :class:`NoServer` with the log's tail when it exits first."""
    url, log = base_url(host, port), log or log_file(f"serve-{port}.log")
    shown = " ".join(serve_args)
    say(f"mlxbun: starting `mlxbun serve{' ' if shown else ''}{shown}` on port {port} for this "
        f"session (log: {log})")
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlxbun_core.cli", "serve", *serve_args,
                                 "--no-open"], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    try:
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                raise NoServer(f"mlxbun serve exited with status {proc.returncode}:\n"
                               + tail(log), proc.returncode or 1)
            found = _answering(url, api_key)
            if found is not None:
                found.proc, found.log_path = proc, log
                say(f"mlxbun: serving {found.model} (ready in "
                    f"{time.monotonic() - started:.0f} s)")
                return found
            time.sleep(0.3)
        raise NoServer(f"mlxbun serve did not answer within {timeout:.0f} s:\n" + tail(log))
    except BaseException:
        Server(url, "", proc=proc).stop()
        raise


def _answering(url: str, api_key: str | None) -> Server | None:
    try:
        return probe(url, api_key)
    except NoServer:
        return None  # still loading, or not answering as ours yet


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_or_start(model: str | None, *, url: str | None = None, host: str = "127.0.0.1",
                  port: int | None = None, say: Callable[[str], None] = _stderr) -> Server:
    """``mlxbun chat``'s server for ``model``: at ``url`` (it must be running), else the
    one on the usual port when it serves the model, else a fresh one on a free loopback
    port for this session. Raises :class:`NoServer`."""
    if url is not None:
        base = url.rstrip("/").removesuffix("/v1")
        found = probe(base, wanted=model)
        if found is None:
            raise NoServer(f"no mlxbun server answers at {base}")
        return found
    try:
        found = probe(base_url(host, port or default_port()), wanted=model)
    except NoServer:
        found = None  # not one it can use: it starts its own beside it
    if found is not None:
        return found
    own = free_port()
    return start([*([model] if model else []), "--host", "127.0.0.1", "--port", str(own)],
                 own, say=say)
