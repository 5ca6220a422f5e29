"""``mlxbun memory schedule`` / ``unschedule``: real ``mlxbun`` subprocesses with a tmp HOME
and stand-in ``launchctl``, ``systemctl`` and ``crontab`` on PATH that record their
arguments (the crontab one keeps its table in a file, as the real one does)."""

from __future__ import annotations

import os
import plistlib
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mlxbun_core.memory.vault import Vault

STANDINS = {
    "launchctl": 'echo "launchctl $*" >> "$CALLS"\n',
    "systemctl": 'echo "systemctl $*" >> "$CALLS"\n'
                 '[ "$2" = show-environment ] && exit "${USER_MANAGER_RC:-0}"\nexit 0\n',
    "crontab": 'echo "crontab $*" >> "$CALLS"\n'
               'if [ "$1" = -l ]; then\n'
               '  [ -f "$TABLE" ] || { echo "no crontab for you" >&2; exit 1; }\n'
               '  cat "$TABLE"\nelse cat > "$TABLE"\nfi\n',
}
FOREIGN_CRON = "15 * * * * /usr/bin/backup --quiet # mine"


class Box:
    """A tmp HOME, a vault, the stand-ins, and ``mlxbun memory`` run inside them."""

    def __init__(self, tmp: Path) -> None:
        self.home, self.bin, self.calls = tmp / "home", tmp / "bin", tmp / "calls.log"
        self.table, self.mlxbun_home = tmp / "crontab.txt", tmp / "mlxbun"
        self.bin.mkdir()
        for name, body in STANDINS.items():
            script = self.bin / name
            script.write_text("#!/bin/sh\n" + body)
            script.chmod(0o755)
        self.root = Vault(tmp / "wiki").setup().root
        self.units = self.home / ".config" / "systemd" / "user"
        self.plist = self.home / "Library" / "LaunchAgents" / "com.mlxbun.memory.plist"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
        return {**env, "HOME": str(self.home), "MLXBUN_HOME": str(self.mlxbun_home),
                "MLXBUN_WIKI": str(self.root), "CALLS": str(self.calls),
                "TABLE": str(self.table), "PATH": f"{self.bin}:{os.environ['PATH']}", **extra}

    def memory(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "memory", *args],
                              env=self.env(**extra), capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    def take_calls(self) -> list[str]:
        """The scheduler commands run since the last look."""
        lines = self.calls.read_text().splitlines() if self.calls.exists() else []
        self.calls.unlink(missing_ok=True)
        return lines

    def cron_lines(self) -> list[str]:
        return self.table.read_text().splitlines() if self.table.exists() else []


@pytest.fixture
def box(tmp_path) -> Box:
    return Box(tmp_path)


def ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_cron_line_is_replaced_listed_and_removed_and_a_foreign_line_stays(box):
    box.table.write_text(FOREIGN_CRON + "\n")
    no_manager = {"USER_MANAGER_RC": "1"}  # systemctl is there, a user manager is not
    out = ok(box.memory("schedule", "--every", "30m", **no_manager))
    assert "cron: memory synthesize, every 1800s" in out
    lines = box.cron_lines()
    assert lines[0] == FOREIGN_CRON and len(lines) == 2
    fields, tag = lines[1].split()[:5], lines[1].rsplit("#", 1)[1]
    assert fields == ["*/30", "*", "*", "*", "*"] and tag == " mlxbun memory schedule"
    assert f"--root {box.root} synthesize" in lines[1]
    assert f"MLXBUN_HOME={box.mlxbun_home}" in lines[1]
    assert box.take_calls() == ["systemctl --user show-environment", "crontab -l",
                                "crontab -l", "crontab -"]

    ok(box.memory("schedule", "--at", "04:15", **no_manager))  # replaces, never adds
    lines = box.cron_lines()
    assert lines[0] == FOREIGN_CRON and len(lines) == 2 and lines[1].startswith("15 4 * * * ")
    before = box.table.read_text()
    box.take_calls()
    ok(box.memory("schedule", "--at", "04:15", **no_manager))  # the same again: no write
    assert box.table.read_text() == before and "crontab -" not in box.take_calls()

    assert '"when": "15 4 * * *"' in ok(box.memory("status"))  # the vault's status says so too
    status = ok(box.memory("schedule", "--status"))
    assert '"backend": "cron"' in status and '"when": "15 4 * * *"' in status
    assert '"command": "env MLXBUN_HOME=' in status

    ok(box.memory("unschedule"))
    assert box.cron_lines() == [FOREIGN_CRON]
    box.take_calls()
    again = ok(box.memory("unschedule"))
    assert "no memory job is scheduled" in again and "crontab -" not in box.take_calls()
    assert '"installed": []' in ok(box.memory("schedule", "--status"))


def test_the_scheduled_command_runs_the_memory_verb(box):
    ok(box.memory("schedule", "synthesize", "--dry-run", USER_MANAGER_RC="1"))
    line = box.cron_lines()[0]
    command = line.split(None, 5)[5]  # past the five time fields, as cron would run it
    run = subprocess.run(["sh", "-c", command], env=box.env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    log = (box.mlxbun_home / "logs" / "memory-schedule.log").read_text()
    assert "stage: [ingest]" in log and "done: dry run" in log


def test_systemd_units_calls_and_removal(box):
    box.units.mkdir(parents=True)
    foreign = box.units / "backup.timer"
    foreign.write_text("[Timer]\nOnCalendar=daily\n")
    out = ok(box.memory("schedule", "link", "--limit", "5"))
    assert "systemd: memory link --limit 5, daily at 03:00" in out
    assert "enable-linger" in out
    service = (box.units / "mlxbun-memory.service").read_text()
    timer = (box.units / "mlxbun-memory.timer").read_text()
    assert "Type=oneshot" in service
    exec_start = next(ln for ln in service.splitlines() if ln.startswith("ExecStart="))
    assert shlex.split(exec_start[len("ExecStart="):])[-6:] == [
        "memory", "--root", str(box.root), "link", "--limit", "5"]
    assert f'Environment="MLXBUN_HOME={box.mlxbun_home}"' in service
    assert "OnCalendar=*-*-* 03:00:00" in timer and "Persistent=true" in timer
    assert box.take_calls() == ["systemctl --user show-environment",
                                "crontab -l",  # is the job on cron already? (no)
                                "systemctl --user daemon-reload",
                                "systemctl --user enable --now mlxbun-memory.timer"]

    ok(box.memory("schedule", "--every", "6h"))
    timer = (box.units / "mlxbun-memory.timer").read_text()
    assert "OnUnitActiveSec=21600s" in timer and "OnCalendar" not in timer
    assert not box.table.exists()  # cron never touched
    assert '"backend": "systemd"' in ok(box.memory("schedule", "--status"))
    box.take_calls()

    ok(box.memory("unschedule"))
    assert sorted(p.name for p in box.units.iterdir()) == ["backup.timer"]
    assert foreign.read_text() == "[Timer]\nOnCalendar=daily\n"
    assert box.take_calls() == ["crontab -l", "systemctl --user disable --now mlxbun-memory.timer",
                                "systemctl --user daemon-reload"]


def test_systemd_will_not_overwrite_a_unit_it_did_not_write(box):
    box.units.mkdir(parents=True)
    theirs = box.units / "mlxbun-memory.timer"
    theirs.write_text("[Timer]\nOnCalendar=weekly\n")
    run = box.memory("schedule")
    assert run.returncode == 1 and "was not written by mlxbun" in run.stderr
    assert theirs.read_text() == "[Timer]\nOnCalendar=weekly\n"
    ok(box.memory("unschedule"))
    assert theirs.exists() and not (box.units / "mlxbun-memory.service").exists()


def test_launchd_agent_is_written_loaded_and_removed(box):
    agents = box.plist.parent
    agents.mkdir(parents=True)
    (agents / "com.example.other.plist").write_bytes(plistlib.dumps({"Label": "other"}))
    ok(box.memory("schedule", "--backend", "launchd", "--at", "02:30"))
    spec = plistlib.loads(box.plist.read_bytes())
    assert spec["Label"] == "com.mlxbun.memory"
    assert spec["ProgramArguments"][-4:] == ["memory", "--root", str(box.root), "synthesize"]
    assert spec["StartCalendarInterval"] == {"Hour": 2, "Minute": 30}
    assert spec["EnvironmentVariables"]["MLXBUN_HOME"] == str(box.mlxbun_home)
    assert spec["StandardOutPath"] == str(box.mlxbun_home / "logs" / "memory-schedule.log")
    domain = f"gui/{os.getuid()}"
    assert box.take_calls() == ["crontab -l", f"launchctl bootout {domain}/com.mlxbun.memory",
                                f"launchctl bootstrap {domain} {box.plist}"]

    ok(box.memory("schedule", "--backend", "launchd", "--every", "1h30m"))
    spec = plistlib.loads(box.plist.read_bytes())
    assert spec["StartInterval"] == 5400 and "StartCalendarInterval" not in spec
    assert '"when": "every 5400s"' in ok(box.memory("schedule", "--status"))
    box.take_calls()

    ok(box.memory("unschedule"))
    assert sorted(p.name for p in agents.iterdir()) == ["com.example.other.plist"]
    assert box.take_calls() == ["crontab -l", f"launchctl bootout {domain}/com.mlxbun.memory"]


def test_moving_to_another_backend_removes_the_old_job(box):
    box.table.write_text(FOREIGN_CRON + "\n")
    ok(box.memory("schedule", USER_MANAGER_RC="1"))
    assert len(box.cron_lines()) == 2
    out = ok(box.memory("schedule"))  # the user manager answers now
    assert "removed the cron job" in out
    assert box.cron_lines() == [FOREIGN_CRON]
    assert (box.units / "mlxbun-memory.timer").exists()


@pytest.mark.parametrize(("args", "why"), [
    (["--at", "25:00"], "want a local time HH:MM"),
    (["--every", "10s"], "at least a minute"),
    (["--every", "7m", "--backend", "cron"], "cron cannot run every 7 minutes"),
    (["serve"], "cannot schedule 'serve'"),
    (["synthesize", "--nope"], "unknown '--nope'"),
    (["link", "--limit", "many"], "does not parse"),
    (["--at", "03:00", "--every", "1h"], "not allowed with argument"),
])
def test_bad_requests_are_refused_and_install_nothing(box, args, why):
    run = box.memory("schedule", *args)
    assert run.returncode == 2 and why in run.stderr
    assert not box.calls.exists() or "crontab -" not in box.take_calls()
    assert not box.units.exists() and not box.plist.exists() and not box.table.exists()


def test_no_vault_no_job(box, tmp_path):
    run = box.memory("--root", str(tmp_path / "elsewhere"), "schedule", USER_MANAGER_RC="1")
    assert run.returncode == 1 and "no memory vault yet" in run.stderr
    assert not box.table.exists()


def test_a_half_install_is_still_removed(box):
    ok(box.memory("schedule"))
    (box.units / "mlxbun-memory.timer").unlink()  # someone deleted one of the two
    assert '"backend": "systemd"' in ok(box.memory("schedule", "--status"))
    ok(box.memory("unschedule"))
    assert list(box.units.iterdir()) == []
