"""The three places ``mlxbun memory schedule`` can put its job: a launchd user agent (macOS),
a systemd user timer and service, or a tagged crontab line.

Each backend writes only its own named artifacts and can tell them apart from anyone else's:
the plist goes by our label, the unit files and the crontab line carry a marker. ``remove``
takes away exactly those and leaves every other agent, unit and crontab line alone.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABEL = "com.mlxbun.memory"  # the launchd label
UNIT = "mlxbun-memory"  # systemd: mlxbun-memory.service + mlxbun-memory.timer
MARK = "mlxbun memory schedule"  # the crontab tag and the units' first comment
UNIT_HEADER = f"# Written by `{MARK}`; `mlxbun memory unschedule` removes it.\n"


class ScheduleError(Exception):
    """A refusal or a scheduler command that failed: one line for the user, exit 1."""


class BadSchedule(ScheduleError):
    """The user asked for something that cannot be scheduled: exit 2, like a usage error."""


@dataclass(frozen=True)
class When:
    """Daily at ``hour:minute``, or every ``seconds``."""

    hour: int = 3
    minute: int = 0
    seconds: int | None = None

    def __str__(self) -> str:
        return (f"every {self.seconds}s" if self.seconds else
                f"daily at {self.hour:02d}:{self.minute:02d}")


@dataclass(frozen=True)
class Job:
    """What runs: the argv, the environment it needs pinned, where its output goes."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    what: str  # the memory verb and its flags, for descriptions


def call(*argv: str, stdin: str | None = None, check: bool = True) -> int:
    """Run one scheduler command; a failure the caller cares about is a ScheduleError."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ScheduleError(f"{argv[0]}: {exc}") from exc
    if check and done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise ScheduleError(f"`{shlex.join(argv)}` failed ({done.returncode})"
                            + (f": {why[-1]}" if why else ""))
    return done.returncode


class Launchd:
    name = "launchd"

    def __init__(self) -> None:
        self.plist = Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"
        self.domain = f"gui/{os.getuid()}"

    def installed(self) -> dict[str, Any] | None:
        if not self.plist.is_file():
            return None
        try:
            data = plistlib.loads(self.plist.read_bytes())
        except (plistlib.InvalidFileException, ValueError):  # still our label: ours to remove
            return {"backend": self.name, "when": "unreadable", "files": [str(self.plist)]}
        at = data.get("StartCalendarInterval") or {}
        when = (f"every {data['StartInterval']}s" if "StartInterval" in data else
                f"daily at {at.get('Hour', 0):02d}:{at.get('Minute', 0):02d}")
        return {"backend": self.name, "when": when, "files": [str(self.plist)],
                "command": shlex.join(data.get("ProgramArguments", []))}

    def install(self, job: Job, when: When) -> None:
        spec: dict[str, Any] = {
            "Label": LABEL, "ProgramArguments": job.argv, "EnvironmentVariables": job.env,
            "StandardOutPath": str(job.log), "StandardErrorPath": str(job.log),
            "ProcessType": "Background"}
        if when.seconds:
            spec["StartInterval"] = when.seconds
        else:
            spec["StartCalendarInterval"] = {"Hour": when.hour, "Minute": when.minute}
        self.plist.parent.mkdir(parents=True, exist_ok=True)
        self.plist.write_bytes(plistlib.dumps(spec))
        call("launchctl", "bootout", f"{self.domain}/{LABEL}", check=False)  # a reload
        call("launchctl", "bootstrap", self.domain, str(self.plist))

    def remove(self) -> None:
        call("launchctl", "bootout", f"{self.domain}/{LABEL}", check=False)  # may be unloaded
        self.plist.unlink()


class Systemd:
    name = "systemd"

    def __init__(self) -> None:
        config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        self.dir = Path(config) / "systemd" / "user"
        self.service, self.timer = self.dir / f"{UNIT}.service", self.dir / f"{UNIT}.timer"

    @staticmethod
    def available() -> bool:
        """A user manager answers (not merely a systemctl binary on PATH)."""
        return shutil.which("systemctl") is not None and call(
            "systemctl", "--user", "show-environment", check=False) == 0

    def _ours(self, path: Path) -> bool:
        return path.is_file() and path.read_text().startswith(UNIT_HEADER)

    def installed(self) -> dict[str, Any] | None:
        if not (self._ours(self.timer) or self._ours(self.service)):  # a half install too
            return None
        keys = ("OnCalendar=", "OnUnitActiveSec=", "ExecStart=")
        found = {line.split("=", 1)[0]: line.split("=", 1)[1]
                 for path in (self.timer, self.service) if path.is_file()
                 for line in path.read_text().splitlines() if line.startswith(keys)}
        when = (f"OnCalendar={found['OnCalendar']}" if "OnCalendar" in found else
                f"every {found.get('OnUnitActiveSec', '?')}")
        return {"backend": self.name, "when": when,
                "files": [str(self.service), str(self.timer)],
                "command": found.get("ExecStart", "").replace("%%", "%"),
                "log": f"journalctl --user -u {UNIT}.service"}

    def install(self, job: Job, when: When) -> None:
        for path in (self.service, self.timer):
            if path.exists() and not self._ours(path):
                raise ScheduleError(f"{path} exists and was not written by mlxbun: "
                                    "left as it is; move it away first")
        env = "".join(f'Environment="{_unit_escape(k)}={_unit_escape(v)}"\n'
                      for k, v in job.env.items())
        self.dir.mkdir(parents=True, exist_ok=True)
        self.service.write_text(
            f"{UNIT_HEADER}[Unit]\nDescription=mlxbun memory {_unit_escape(job.what)}\n\n"
            f"[Service]\nType=oneshot\n{env}"
            f"ExecStart={_unit_escape(shlex.join(job.argv))}\n")
        trigger = (f"OnActiveSec={when.seconds}s\nOnUnitActiveSec={when.seconds}s\n"
                   if when.seconds else
                   f"OnCalendar=*-*-* {when.hour:02d}:{when.minute:02d}:00\nPersistent=true\n")
        self.timer.write_text(
            f"{UNIT_HEADER}[Unit]\nDescription=mlxbun memory, {when}\n\n"
            f"[Timer]\n{trigger}\n[Install]\nWantedBy=timers.target\n")
        call("systemctl", "--user", "daemon-reload")
        call("systemctl", "--user", "enable", "--now", self.timer.name)

    def remove(self) -> None:
        call("systemctl", "--user", "disable", "--now", self.timer.name, check=False)
        for path in (self.timer, self.service):
            if self._ours(path):
                path.unlink()
        call("systemctl", "--user", "daemon-reload", check=False)


def _unit_escape(text: str) -> str:
    """systemd expands ``%`` specifiers in unit values; a literal one is ``%%``."""
    return text.replace("%", "%%")


class Cron:
    name = "cron"
    tag = f"# {MARK}"

    @staticmethod
    def available() -> bool:
        return shutil.which("crontab") is not None

    def _lines(self) -> list[str]:
        if not self.available():
            raise ScheduleError("no crontab command here")
        done = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=60)
        return done.stdout.splitlines() if done.returncode == 0 else []  # 1: no crontab yet

    def _write(self, lines: list[str]) -> None:
        call("crontab", "-", stdin="".join(f"{line}\n" for line in lines))

    def installed(self) -> dict[str, Any] | None:
        if not self.available():
            return None
        ours = [line for line in self._lines() if line.endswith(self.tag)]
        if not ours:
            return None
        fields = ours[0].split(None, 5)
        return {"backend": self.name, "when": " ".join(fields[:5]), "files": [],
                "command": fields[5].removesuffix(self.tag).rstrip(), "line": ours[0]}

    def install(self, job: Job, when: When) -> None:
        fields = _cron_fields(when)
        command = shlex.join(["env", *(f"{k}={v}" for k, v in job.env.items()), *job.argv])
        line = f"{fields} {command} >> {shlex.quote(str(job.log))} 2>&1 {self.tag}"
        if "%" in line:  # cron turns an unescaped % into a newline
            line = line.replace("%", "\\%")
        lines = self._lines()
        kept = [old for old in lines if not old.endswith(self.tag)]
        if kept + [line] != lines:
            self._write(kept + [line])

    def remove(self) -> None:
        lines = self._lines()
        kept = [line for line in lines if not line.endswith(self.tag)]
        if kept != lines:
            self._write(kept)


def _cron_fields(when: When) -> str:
    """The five time fields; an interval must step evenly through the hour or the day."""
    if not when.seconds:
        return f"{when.minute} {when.hour} * * *"
    minutes = when.seconds // 60
    if minutes < 60 and 60 % minutes == 0:
        return f"*/{minutes} * * * *"
    if minutes % 60 == 0 and 24 % (minutes // 60) == 0:
        hours = minutes // 60
        return "0 0 * * *" if hours == 24 else f"0 */{hours} * * *"
    raise BadSchedule(f"cron cannot run every {minutes} minutes: use a number of minutes "
                        "that divides 60, of hours that divides 24, or --at HH:MM")


BACKENDS: dict[str, type[Launchd] | type[Systemd] | type[Cron]] = {
    "launchd": Launchd, "systemd": Systemd, "cron": Cron}
