"""``mlxbun memory schedule`` / ``unschedule``: run synthesis (or another memory verb) on a
timer, with the system's own scheduler (:mod:`.schedulers`).

The job is this Python running ``mlxbun_core.cli memory --root <vault> <verb>``, with the
variables that move mlxbun's files pinned, so it finds the same vault, chats and models at
03:00 as it does in the shell that scheduled it. Only one job is kept: scheduling again
replaces it, on whichever backend it was.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from ..models.paths import mlxbun_home
from .schedulers import BACKENDS, BadSchedule, Cron, Job, Launchd, ScheduleError, Systemd, When
from .vault import Vault

JOB_VERBS = ("synthesize", "pipeline", "all", "link")  # what may run unattended
PINNED_ENV = ("MLXBUN_HOME", "HF_HOME", "HF_HUB_CACHE", "PYTHONPATH")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60}


def add_parsers(msub: argparse._SubParsersAction) -> None:
    s = msub.add_parser("schedule", help="run synthesis on a timer (launchd, systemd or cron)")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--at", metavar="HH:MM", help="daily at this local time (default 03:00)")
    when.add_argument("--every", metavar="DURATION", help="at this interval: 30m, 6h, 1d, 1h30m")
    when.add_argument("--status", action="store_true", help="say what is installed, change nothing")
    s.add_argument("--backend", choices=("auto", *BACKENDS), default="auto",
                   help="auto: launchd on macOS, a systemd user timer where the user manager "
                        "answers, else cron")
    s.add_argument("job", nargs=argparse.REMAINDER, metavar="VERB ...",
                   help="the memory verb to run and its flags, last (default: synthesize)")
    msub.add_parser("unschedule", help="remove what `memory schedule` installed")


def parse_when(at: str | None, every: str | None) -> When:
    if every is not None:
        parts = re.fullmatch(r"(?:\d+[dhm])+", every.strip().lower())
        seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in
                      re.findall(r"(\d+)([dhm])", every.lower())) if parts else 0
        if seconds < 60:
            raise BadSchedule(f"--every {every!r}: want a duration of at least a minute "
                                "in d, h and m (30m, 6h, 1d, 1h30m)")
        return When(seconds=seconds)
    if at is None:
        return When()
    hit = re.fullmatch(r"(\d{1,2}):(\d{2})", at.strip())
    if not hit or int(hit[1]) > 23 or int(hit[2]) > 59:
        raise BadSchedule(f"--at {at!r}: want a local time HH:MM, 00:00 to 23:59")
    return When(hour=int(hit[1]), minute=int(hit[2]))


def build_job(vault: Vault, words: list[str], add_verbs: Callable[[Any], None]) -> Job:
    """This interpreter running the memory verb on this vault; the verb's flags are parsed
    now (``add_verbs``: the memory verbs' parsers), so a typo fails here and not silently
    at night."""
    words = [w for w in words if w != "--"] or ["synthesize"]
    if words[0] not in JOB_VERBS:
        raise BadSchedule(f"cannot schedule {words[0]!r}: the job is one of "
                            f"{', '.join(JOB_VERBS)} (with its flags)")
    check = argparse.ArgumentParser(prog="mlxbun")
    add_verbs(check.add_subparsers(dest="command"))
    try:
        _, unknown = check.parse_known_args(["memory", *words])
    except SystemExit as exc:  # argparse has printed what is wrong with the verb's flags
        raise BadSchedule(f"the job {' '.join(words)!r} does not parse") from exc
    if unknown:
        raise BadSchedule(f"the job {' '.join(words)!r}: unknown {' '.join(unknown)!r}")
    argv = [sys.executable, "-m", "mlxbun_core.cli", "memory", "--root", str(vault.root), *words]
    env = {k: os.environ[k] for k in PINNED_ENV if os.environ.get(k)}
    return Job(argv, env, mlxbun_home() / "logs" / "memory-schedule.log", " ".join(words))


def pick_backend(name: str) -> Launchd | Systemd | Cron:
    if name != "auto":
        return BACKENDS[name]()
    if sys.platform == "darwin":
        return Launchd()
    if Systemd.available():
        return Systemd()
    if Cron.available():
        return Cron()
    raise ScheduleError("no scheduler here: neither a systemd user manager nor crontab")


def installed() -> list[tuple[Launchd | Systemd | Cron, dict[str, object]]]:
    """Every backend that holds our job now (normally one)."""
    found = []
    for backend in (Launchd(), Systemd(), Cron()):
        entry = backend.installed()
        if entry is not None:
            found.append((backend, entry))
    return found


def cmd_schedule(vault: Vault, args: argparse.Namespace, add_verbs: Callable[[Any], None]) -> int:
    try:
        if args.status:
            print(json.dumps({"installed": [e for _, e in installed()]}, indent=2))
            return 0
        when = parse_when(args.at, args.every)
        vault.require()
        job = build_job(vault, args.job, add_verbs)
        backend = pick_backend(args.backend)
        for other, _ in installed():
            if other.name != backend.name:
                other.remove()
                print(f"mlxbun: removed the {other.name} job (one job at a time)")
        job.log.parent.mkdir(parents=True, exist_ok=True)
        backend.install(job, when)
    except ScheduleError as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, BadSchedule) else 1
    print(f"mlxbun: {backend.name}: memory {job.what}, {when}; output to {job.log}")
    if backend.name == "systemd":
        print("mlxbun: a user timer runs while you are logged in; "
              "`loginctl enable-linger` keeps it running after you log out")
    return 0


def cmd_unschedule() -> int:
    found = installed()
    try:
        for backend, _ in found:
            backend.remove()
            print(f"mlxbun: removed the {backend.name} job")
    except ScheduleError as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 1
    if not found:
        print("mlxbun: no memory job is scheduled")
    return 0
