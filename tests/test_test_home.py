"""The suite never writes into the user's real mlxbun home (chats, conversions, jobs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mlxbun_core.models.resolve import mlxbun_home
from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webapp.state import of as web_state
from scripted_model import scripted_server


def test_the_session_runs_under_a_temporary_home():
    home = Path(os.environ["MLXBUN_HOME"]).resolve()
    assert home != (Path.home() / ".cache" / "mlxbun").resolve()
    assert home.name.startswith("mlxbun-test-home-")
    assert mlxbun_home().resolve() == home


def test_a_web_chat_on_a_server_started_without_a_sessions_dir_lands_in_the_test_home():
    """The reported leak: ``scripted_server`` gives no sessions directory, so the web chat
    fell back to ``~/.cache/mlxbun/sessions``."""
    with scripted_server("Hello there.", name="scripted-home") as (srv, _):
        with ChatClient(srv.base_url) as c:
            c.hello()
            c.turn(text="Hi")
        store = web_state(srv.server.config.app).sessions
    assert store.root.resolve().is_relative_to(Path(os.environ["MLXBUN_HOME"]).resolve())
    assert store.files(), "the chat was saved"


GUARDED_RUN = """
import os
from mlxbun_core.models.resolve import mlxbun_home

def test_writes_where_it_should_not():
    os.environ.pop("MLXBUN_HOME")  # what a test that forgets the session home amounts to
    (mlxbun_home() / "sessions").mkdir(parents=True)
    (mlxbun_home() / "sessions" / "leak.jsonl").write_text("{}")

def test_writes_where_it_should():
    (mlxbun_home() / "fine.txt").write_text("ok")
"""


def run_guarded(tmp_path: Path, selector: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_guarded.py").write_text(textwrap.dedent(GUARDED_RUN))
    env = {k: v for k, v in os.environ.items() if k != "MLXBUN_HOME"}
    env["HOME"] = str(tmp_path / "user")  # the "real" home of this inner run
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "mlxbun_core.testing.fixtures",
                           "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_guarded.py"), "-k", selector],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_run_that_touches_the_real_home_fails(tmp_path):
    r = run_guarded(tmp_path, "should_not")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "real mlxbun home changed" in r.stdout
    assert "sessions/leak.jsonl" in r.stdout
    assert "1 passed" in r.stdout  # the test itself passed: the guard failed the run


def test_a_run_that_keeps_to_the_test_home_passes(tmp_path):
    r = run_guarded(tmp_path, "not should_not")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "user" / ".cache" / "mlxbun").exists()
