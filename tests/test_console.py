"""The command line's conveniences: ``--version``, bare ``mlxbun`` serving, ``help VERB``,
a quiet exit into a closed pipe, and ``mlxbun chat`` driven through a pipe and a pty
against real servers (one it finds, one it starts)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from mlxbun_core.cli import main
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import free_port
from scripted_model import scripted_server

CLI = [sys.executable, "-m", "mlxbun_core.cli"]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert re.match(r"mlxbun \d+\.\d+\.\d+ · mlx \S+ · mlx-lm \S+ · Python 3\.", out), out


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_bare_mlxbun_serves(busy_port, monkeypatch, capsys):
    """No verb, or only serve's options, is `serve` (here it stops at the busy port,
    before any model loads: the message is serve's own)."""
    monkeypatch.setenv("MLXBUN_PORT", str(busy_port))
    assert main([]) == 2
    assert f"port {busy_port} on 127.0.0.1 is already in use" in capsys.readouterr().err
    monkeypatch.delenv("MLXBUN_PORT")
    assert main(["--port", str(busy_port), "--no-open"]) == 2
    assert f"port {busy_port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_help_verb(capsys):
    assert main(["help", "fit"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mlxbun fit") and "--kv-quant" in out
    assert main(["help"]) == 0
    assert "chat" in capsys.readouterr().out
    assert main(["help", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "no verb 'nosuch'" in err and "serve" in err


@pytest.mark.parametrize("verb", [["config", "show", "--json"], ["plugins"]])
def test_a_reader_that_left_ends_the_verb_quietly(verb):
    """`mlxbun config show --json | head`: the reader is gone before the verb prints."""
    proc = subprocess.Popen(CLI + verb, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as head does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# ---------------------------------------------------------------- mlxbun chat

def turns(prompt: str) -> str:
    """The scripted reply: how many user turns the model was shown."""
    return f"I see {prompt.count('<|im_start|>user')} turns."


@pytest.fixture(scope="module")
def scripted():
    with scripted_server("", name="scripted-chat") as (srv, plugin):
        plugin.reply = turns
        yield srv, plugin


def test_chat_through_a_pipe_keeps_the_conversation(scripted):
    srv, plugin = scripted
    r = subprocess.run(CLI + ["chat", "--url", srv.base_url, "--system", "Be brief."],
                       input="hello\nand again\n/clear\nfresh start\n", capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["I see 1 turns.", "I see 2 turns.", "I see 1 turns."]
    assert "Be brief." in plugin.prompts[-1] and "and again" not in plugin.prompts[-1]
    assert "and again" in plugin.prompts[-2] and "hello" in plugin.prompts[-2]
    assert "(conversation cleared)" in r.stderr


def test_chat_in_a_terminal_has_line_history(scripted, tmp_path):
    """On a pty: a prompt, readline's history (the up arrow brings the last message
    back), streaming, and Ctrl-D ending it."""
    import pty

    srv, plugin = scripted
    main_fd, child_fd = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "MLXBUN_HOME": str(tmp_path)}
    proc = subprocess.Popen(CLI + ["chat", "--url", srv.base_url], stdin=child_fd,
                            stdout=child_fd, stderr=child_fd, env=env, close_fds=True)
    os.close(child_fd)
    seen = b""

    def until(needle: bytes, timeout: float = 60) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while needle not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, seen.decode(
                errors="replace")
            try:
                seen += os.read(main_fd, 4096)
            except OSError:
                break
        assert needle in seen, seen.decode(errors="replace")

    try:
        until(b">>> ")
        os.write(main_fd, b"tell me\r")
        until(b"I see 1 turns.")
        until(b">>> ")
        seen = b""
        os.write(main_fd, b"\x1b[A\r")  # up arrow: "tell me" again
        until(b"I see 2 turns.")
        assert plugin.prompts[-1].count("tell me") == 2
        until(b">>> ")
        for _ in range(10):  # Ctrl-D; one sent before readline has the terminal is lost
            os.write(main_fd, b"\x04")
            try:
                proc.wait(3)
                break
            except subprocess.TimeoutExpired:
                continue
        assert proc.wait(1) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main_fd)
    assert "tell me" in (tmp_path / "chat_history").read_text()


def test_chat_starts_a_server_when_none_runs_and_stops_it_after(tmp_path):
    """Nothing answers on the port it looks at: it starts `mlxbun serve MODEL` for the
    session, chats with it, and stops it when the chat ends."""
    model = tiny_checkpoint("llama", seed=6)
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path)}
    r = subprocess.run(CLI + ["chat", str(model), "--port", str(free_port()),
                              "--max-tokens", "5", "--temperature", "0"],
                       input="hi there\n", capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    started = re.search(r"starting `mlxbun serve .*` on port (\d+)", r.stderr)
    assert started, r.stderr
    assert r.stdout.strip(), r.stderr  # the random model's five tokens
    assert f"at http://127.0.0.1:{started.group(1)}" in r.stderr
    with socket.socket() as probe:  # stopped: nothing listens there any more
        assert probe.connect_ex(("127.0.0.1", int(started.group(1)))) != 0
    assert list((tmp_path / "logs").glob("serve-*.log"))


def test_chat_with_a_server_that_is_not_there_says_so():
    r = subprocess.run(CLI + ["chat", "--url", f"http://127.0.0.1:{free_port()}"],
                       input="", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no mlxbun server answers at" in r.stderr, r.stderr
