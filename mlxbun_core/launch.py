"""``mlxbun launch claude|codex [SERVE FLAGS] [-- CLIENT ARGS]``: a coding agent on mlxbun.

Finds the server the serve flags (and ``mlxbun.yaml``, ``MLXBUN_HOST``/``MLXBUN_PORT``)
point at by asking its ``/health`` and ``/v1/models``, or starts ``mlxbun serve`` with
those flags in its own session (so the client's Ctrl-C never reaches it; its log goes to
``<home>/logs/``), then runs the client in the foreground with what it needs:

- **Claude Code**: ``ANTHROPIC_BASE_URL``, a token, the served model's real name for
  every model slot, a long request timeout (a CPU reads its ~12k-token prompt in
  minutes), and the switches that stop it phoning home (updates, telemetry, error
  reports);
- **Codex CLI**: a throwaway ``CODEX_HOME`` whose ``config.toml`` names a custom
  provider on the Responses wire (``wire_api = "responses"``), the model and its window.

A server this command started is drained and stopped when the client exits. A client
that is not installed gets the npm command that installs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLIENTS = {  # what to run, and the npm package that provides it
    "claude": ("claude", "@anthropic-ai/claude-code"),
    "codex": ("codex", "@openai/codex"),
}
START_TIMEOUT_S = 900.0  # a first start may convert the embedded GGUF and calibrate
STOP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_MS = 3_600_000  # the clients' own defaults (5-10 min) are less than a CPU prefill
NO_PHONING_HOME = {"DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
                   "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
CLAUDE_MODEL_SLOTS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                      "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                      "ANTHROPIC_SMALL_FAST_MODEL")


class LaunchFailed(Exception):
    """Said on stderr; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


@dataclass
class Server:
    """A server that answers: where, its model, and the process when we started it."""

    url: str  # http://host:port (no /v1)
    model: str  # the served model's id (what the client must send)
    context_window: int | None
    api_key: str | None
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch", help="run Claude Code or Codex against mlxbun (starts a server if none "
                       "answers, stops it after)",
        description="Run a coding agent against mlxbun. Flags before -- are `mlxbun serve` "
                    "flags (they pick the server to find or start: --model, --port, "
                    "--context-length, --ssd-cache, ...); arguments after -- go to the "
                    "client.")
    p.add_argument("client", choices=sorted(CLIENTS))
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="[SERVE FLAGS] [-- ARGS]")


def split_args(rest: list[str]) -> tuple[list[str], list[str]]:
    """``(serve flags, client args)``: the client's come after the first ``--``."""
    if "--" in rest:
        i = rest.index("--")
        return rest[:i], rest[i + 1:]
    return rest, []


def serve_settings(flags: list[str]) -> argparse.Namespace:
    """The serve flags as ``mlxbun serve`` would take them (file and environment too)."""
    from .config import apply_config
    from .serve_flags import add_serve_parser

    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="mlxbun launch CLIENT")
        add_serve_parser(p.add_subparsers(dest="command", required=True))
        return p

    argv = ["serve", *flags]
    args = parser().parse_args(argv)
    apply_config(args, argv, parser)
    return args


def base_url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"  # every interface: loopback is one of them
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def probe(url: str, api_key: str | None, wanted: str | None) -> Server | None:
    """The mlxbun server answering at ``url`` (None: nothing listens there).
    :class:`LaunchFailed` when something answers that cannot serve ``wanted``."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        health = httpx.get(f"{url}/health", headers=headers, timeout=5)
    except httpx.TransportError:
        return None
    if health.status_code == 503:
        raise LaunchFailed(f"the server at {url} is not ready ({health.text.strip()[:200]})")
    try:
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=10)
        rows = models.json()["data"] if models.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        models, rows = None, None
    if health.status_code == 401 or (models is not None and models.status_code == 401):
        raise LaunchFailed(f"the server at {url} wants an API key: pass --api-key KEY (or set "
                           "MLXBUN_API_KEY)", 2)
    if health.status_code != 200 or not rows:
        raise LaunchFailed(f"{url} answers, but not as an mlxbun server (HTTP "
                           f"{health.status_code}); stop it or pick another --port", 2)
    row = served_row(rows, wanted)
    if row is None:
        raise LaunchFailed(f"the server at {url} does not serve {wanted!r} (it serves "
                           f"{rows[0].get('id')}); stop it, or pick another --port to start "
                           "one for it", 2)
    return Server(url, str(row["id"]), row.get("context_window"), api_key)


def served_row(rows: list[dict[str, Any]], wanted: str | None) -> dict[str, Any] | None:
    """The row the client should name: the served (first) one, or with ``wanted`` (an
    id, an alias, a directory) a resident model by that name (None: not served now)."""
    if not wanted:
        return rows[0]
    names = {wanted, Path(wanted).name}
    for i, row in enumerate(rows):
        resident = i == 0 or row.get("state") == "resident"
        if resident and names & {row.get("id"), row.get("alias_of")}:
            return row
    return None


def log_path(port: int) -> Path:
    from .models.paths import mlxbun_home

    d = mlxbun_home() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"launch-serve-{port}.log"


def start_server(flags: list[str], settings: argparse.Namespace) -> Server:
    """``mlxbun serve FLAGS`` in its own session, waited for until it answers."""
    url = base_url(settings.host, settings.port)
    log = log_path(settings.port)
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", *flags, "--no-open"]
    print(f"mlxbun: starting `mlxbun serve{' ' if flags else ''}{' '.join(flags)}` on {url} "
          f"(log: {log})", file=sys.stderr, flush=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    started = time.monotonic()
    while time.monotonic() - started < START_TIMEOUT_S:
        if proc.poll() is not None:
            raise LaunchFailed(f"mlxbun serve exited with status {proc.returncode}:\n"
                               + tail(log), proc.returncode or 1)
        try:
            found = probe(url, settings.api_key, None)
        except LaunchFailed:
            found = None  # still loading, or not ours yet
        if found is not None:
            found.process, found.log = proc, log
            print(f"mlxbun: serving {found.model} (ready in {time.monotonic() - started:.0f} s)",
                  file=sys.stderr, flush=True)
            return found
        time.sleep(0.5)
    stop_server(proc)
    raise LaunchFailed(f"mlxbun serve did not answer within {START_TIMEOUT_S:.0f} s:\n"
                       + tail(log))


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Drain (SIGTERM), then kill what is still there after :data:`STOP_TIMEOUT_S`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def find_client(client: str) -> str:
    name, package = CLIENTS[client]
    found = shutil.which(name)
    if found is None:
        raise LaunchFailed(f"{name} is not installed (or not on PATH). Install it with:\n"
                           f"  npm install -g {package}", 127)
    return found


def claude_env(server: Server) -> dict[str, str]:
    """What Claude Code needs: our URL, a token (an approval prompt comes with an API
    key, none with a token), the real model name in every slot, no phoning home."""
    env = {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_AUTH_TOKEN": server.api_key or "mlxbun",
           "ANTHROPIC_API_KEY": "", "API_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS),
           # its stream watchdog: a silent stream is dropped after 5 minutes; with pings, it
           # still sends the whole request again, unstreamed, after 10 without a token
           "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS), **NO_PHONING_HOME}
    env.update(dict.fromkeys(CLAUDE_MODEL_SLOTS, server.model))
    return env


def codex_home(server: Server, root: Path) -> dict[str, str]:
    """A ``CODEX_HOME`` under ``root`` for this server: a custom provider on the
    Responses wire, the model, its window (Codex compacts before it)."""
    home = root / "codex-home"
    home.mkdir(parents=True, exist_ok=True)
    lines = [f"model = {toml_string(server.model)}", 'model_provider = "mlxbun"',
             "check_for_update_on_startup = false"]
    if server.context_window:
        lines.append(f"model_context_window = {int(server.context_window)}")
    lines += ["", "[model_providers.mlxbun]", 'name = "mlxbun"',
              f"base_url = {toml_string(server.url + '/v1')}", 'wire_api = "responses"',
              # its 5-minute default gives up while a CPU still reads the first prompt
              f"stream_idle_timeout_ms = {REQUEST_TIMEOUT_MS}"]
    env = {"CODEX_HOME": str(home)}
    if server.api_key:
        lines.append('env_key = "MLXBUN_API_KEY"')
        env["MLXBUN_API_KEY"] = server.api_key
    lines += ["", "[analytics]", "enabled = false", ""]
    (home / "config.toml").write_text("\n".join(lines), encoding="utf-8")
    return env


def toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_client(client: str, server: Server, args: list[str]) -> int:
    """The client in the foreground; its exit status. Ctrl-C is the client's alone."""
    exe = find_client(client)
    with tempfile.TemporaryDirectory(prefix="mlxbun-launch-") as tmp:
        extra = claude_env(server) if client == "claude" else codex_home(server, Path(tmp))
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return subprocess.call([exe, *args], env={**os.environ, **extra})
        finally:
            signal.signal(signal.SIGINT, previous)


def cmd_launch(args: argparse.Namespace, argv: list[str]) -> int:
    """``mlxbun launch``; ``argv`` is the command line (argparse drops a leading ``--``
    from ``args.rest``, so the split is made on the words as typed)."""
    start = argv.index("launch") + 1
    flags, client_args = split_args(argv[argv.index(args.client, start) + 1:])
    try:
        find_client(args.client)  # before any server starts for it
        settings = serve_settings(flags)
        wanted = settings.model or settings.positional
        url = base_url(settings.host, settings.port)
        server = probe(url, settings.api_key, wanted) if not settings.unix else None
        if server is not None:
            print(f"mlxbun: using the server at {url} ({server.model})", file=sys.stderr)
        else:
            server = start_server(flags, settings)
        print(cold_start_note(args.client), file=sys.stderr, flush=True)
    except LaunchFailed as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return exc.status
    previous = {s: signal.signal(s, _stop_on) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return run_client(args.client, server, client_args)
    except LaunchFailed as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return exc.status
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if server.process is not None:
            print("mlxbun: stopping the server it started", file=sys.stderr, flush=True)
            stop_server(server.process)


def _stop_on(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # runs cmd_launch's finally: the server is stopped


def cold_start_note(client: str) -> str:
    what = "Claude Code's ~12k-token" if client == "claude" else "Codex's ~6k-token"
    return (f"mlxbun: on a CPU the first request reads {what} prompt for minutes (13 on a "
            "busy 2-core box); later turns reuse its KV (prefix cache), and --ssd-cache DIR "
            "keeps it across restarts")
