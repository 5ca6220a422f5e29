"""``mlxbun launch claude|codex|pi [SERVE FLAGS] [-- CLIENT ARGS]``: a coding agent on mlxbun.

Finds the server the serve flags (and ``mlxbun.yaml``, ``MLXBUN_HOST``/``MLXBUN_PORT``)
point at, or starts ``mlxbun serve`` with those flags in its own session (so the client's
Ctrl-C never reaches it; its log goes to ``<home>/logs/launch-serve-PORT.log``), the way
``mlxbun chat`` does (``console/finder.py``), then runs the client in the foreground with
what it needs:

- **Claude Code**: ``ANTHROPIC_BASE_URL``, a token, the served model's real name for
  every model slot, a long request timeout (a CPU reads its ~12k-token prompt in
  minutes), and the switches that stop it phoning home (updates, telemetry, error
  reports);
- **Codex CLI**: a throwaway ``CODEX_HOME`` whose ``config.toml`` names a custom
  provider on the Responses wire (``wire_api = "responses"``), the model and its window;
- **pi**: a throwaway ``PI_CODING_AGENT_DIR`` naming our server as its provider on the
  Chat Completions wire, the model and its window (``pi.py``).

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
from pathlib import Path
from typing import Any

from ..console import finder
from ..console.finder import NoServer, Server, base_url, log_file, probe

CLIENTS = {  # what to run, and the npm package that provides it
    "claude": ("claude", "@anthropic-ai/claude-code"),
    "codex": ("codex", "@openai/codex"),
    "pi": ("pi", "@earendil-works/pi-coding-agent"),
}
REQUEST_TIMEOUT_MS = 3_600_000  # the clients' own defaults (5-10 min) are less than a CPU prefill
NO_PHONING_HOME = {"DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
                   "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
CLAUDE_MODEL_SLOTS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                      "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                      "ANTHROPIC_SMALL_FAST_MODEL")


class LaunchFailed(NoServer):
    """Said on stderr; ``status`` is the exit status (a missing client: 127)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch", help="run Claude Code, Codex or pi against mlxbun (starts a server if none "
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
    from ..config import apply_config
    from ..serve_flags import add_serve_parser

    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="mlxbun launch CLIENT")
        add_serve_parser(p.add_subparsers(dest="command", required=True))
        return p

    argv = ["serve", *flags]
    args = parser().parse_args(argv)
    apply_config(args, argv, parser)
    return args


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
    env = {"ANTHROPIC_BASE_URL": server.base_url,
           "ANTHROPIC_AUTH_TOKEN": server.api_key or "mlxbun",
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
              f"base_url = {toml_string(server.base_url + '/v1')}", 'wire_api = "responses"',
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
        extra = client_env(client, server, Path(tmp))
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return subprocess.call([exe, *args], env={**os.environ, **extra})
        finally:
            signal.signal(signal.SIGINT, previous)


def client_env(client: str, server: Server, tmp: Path) -> dict[str, str]:
    """What ``client`` needs in its environment (its config written under ``tmp``)."""
    if client == "claude":
        return claude_env(server)
    if client == "codex":
        return codex_home(server, tmp)
    from .pi import agent_dir

    return agent_dir(server, tmp)


def cmd_launch(args: argparse.Namespace, argv: list[str]) -> int:
    """``mlxbun launch``; ``argv`` is the command line (argparse drops a leading ``--``
    from ``args.rest``, so the split is made on the words as typed)."""
    start = argv.index("launch") + 1
    flags, client_args = split_args(argv[argv.index(args.client, start) + 1:])
    return launch_client(args.client, flags, client_args)


def launch_client(client: str, flags: list[str], client_args: list[str]) -> int:
    """The server ``flags`` point at, found or started; ``client`` against it; the
    client's exit status (``mlxbun pi`` comes in here too)."""
    try:
        find_client(client)  # before any server starts for it
        settings = serve_settings(flags)
        wanted = settings.model or settings.positional
        url = base_url(settings.host, settings.port)
        server = probe(url, settings.api_key, wanted) if not settings.unix else None
        if server is not None:
            print(f"mlxbun: using the server at {url} ({server.model})", file=sys.stderr)
        else:
            server = finder.start(flags, settings.port, host=settings.host,
                                  api_key=settings.api_key,
                                  log=log_file(f"launch-serve-{settings.port}.log"))
        print(cold_start_note(client), file=sys.stderr, flush=True)
    except NoServer as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return exc.status
    previous = {s: signal.signal(s, _stop_on) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return run_client(client, server, client_args)
    except NoServer as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return exc.status
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if server.started:
            print("mlxbun: stopping the server it started", file=sys.stderr, flush=True)
            server.stop()


def _stop_on(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # runs cmd_launch's finally: the server is stopped


def cold_start_note(client: str) -> str:
    what = {"claude": "Claude Code's ~12k-token", "codex": "Codex's ~6k-token",
            "pi": "pi's whole"}[client]
    return (f"mlxbun: on a CPU the first request reads {what} prompt for minutes (13 on a "
            "busy 2-core box); later turns reuse its KV (prefix cache), and --ssd-cache DIR "
            "keeps it across restarts")
