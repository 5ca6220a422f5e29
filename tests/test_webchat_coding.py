"""Coding tools in the web chat: approvals and confinement, through a real server, a real
WebSocket client and the real engine (a scripted model emits the tool calls)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.wschat import ChatClient
from scripted_model import scripted_server


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def scripted():
    with scripted_server("", name="scripted-coding") as (srv, plugin):
        yield srv, plugin


def script(plugin, *replies: str) -> None:
    """Each generation takes the next reply; then the model just says Done."""
    queue = list(replies)
    plugin.reply = lambda prompt: queue.pop(0) if queue else "Done."


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    return root


def coding_client(srv, root) -> ChatClient:
    c = ChatClient(srv.base_url)
    c.hello()
    c.send("set_coding_tools", enabled=True, workspace=str(root))
    state = c.until("coding_tools")[-1]
    assert state["active"] and state["workspace"] == os.path.realpath(root)
    return c


STALL_S = 20.0  # the scripted model answers in well under a second; silence is a hang


def frames_until(c: ChatClient, kind: str, *fail_on: str) -> list:
    """Frames up to the next ``kind``. A frame of a ``fail_on`` type first (a call that
    should have waited ran, one that should have been refused waits for a card) or
    ``STALL_S`` of silence (the turn died) fails at once, naming what came, where
    waiting for ``kind`` would only time out."""
    out: list = []
    while True:
        try:
            frame = c.recv(STALL_S)
        except TimeoutError:
            raise AssertionError(f"no {kind} frame and nothing else for {STALL_S:.0f} s; "
                                 f"the last frames: {out[-3:]}") from None
        out.append(frame)
        if frame["type"] == kind:
            return out
        ran = [f for f in out if f["type"] == "tool_end"]
        assert frame["type"] not in fail_on, f"{frame} came before any {kind}; ran: {ran}"


def approval_request(c: ChatClient) -> dict:
    """The next approval card; the turn ending first fails (the call ran unasked)."""
    return frames_until(c, "tool_approval_request", "turn_end")[-1]


def refused(c: ChatClient) -> dict:
    """The error frame answering a setting; the tools' new state first fails (taken)."""
    return frames_until(c, "error", "coding_tools")[-1]


def finish(c: ChatClient) -> list:
    return c.until("turn_end") + c.until("history")


def ends(frames: list) -> list:
    return [f for f in frames if f["type"] == "tool_end"]


def alive(pid: int) -> bool:
    """A process that runs (a zombie left for an init that does not reap is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def approvals(srv) -> list:
    return httpx.get(srv.base_url + "/api/settings/tool-approvals").json()["alwaysAllow"]


def test_coding_tools_are_off_by_default_and_need_a_folder(scripted, ws):
    srv, plugin = scripted
    script(plugin, call("read", path="a.txt"))
    (ws / "a.txt").write_text("secret\n")
    with ChatClient(srv.base_url) as c:
        greeting = c.hello()
        assert greeting["coding_tools"]["active"] is False
        assert greeting["coding_tools"]["available"] is True
        frames = c.turn(text="read a.txt")
        end = ends(frames)[0]
        assert not end["ok"] and "coding tools are off" in end["result"]["error"]
        assert "secret" not in json.dumps(frames)
        for workspace, why in ((None, "workspace required"), ("relative/dir", "absolute"),
                               ("/", "root")):
            c.send("set_coding_tools", enabled=True,
                   **({} if workspace is None else {"workspace": workspace}))
            assert why in refused(c)["message"]


def test_a_write_waits_deny_keeps_the_file_allow_writes_it(scripted, ws):
    srv, plugin = scripted
    target = ws / "a.txt"
    target.write_text("hello\n")
    with coding_client(srv, ws) as c:
        script(plugin, call("write", path="a.txt", content="bye\n"))
        c.send("prompt", text="change it")
        asked = approval_request(c)
        assert asked["tool"] == "write" and asked["args"] == {"path": "a.txt", "content": "bye\n"}
        assert "-hello\n+bye\n" in asked["preview"]["diff"]
        queue = c.until("queue_update")[-1]
        assert queue["approvals"] == [{"callId": asked["callId"], "tool": "write"}]
        time.sleep(0.3)
        assert target.read_text() == "hello\n"  # it waits for the user
        c.send("approval", callId=asked["callId"], decision="deny")
        end = ends(finish(c))[0]
        assert not end["ok"] and "denied" in end["result"]["error"]
        assert target.read_text() == "hello\n"

        script(plugin, call("write", path="a.txt", content="bye\n"))
        c.send("prompt", text="change it, really")
        asked = approval_request(c)
        c.send("approval", callId=asked["callId"], decision="allow")
        frames = finish(c)
        assert ends(frames)[0]["ok"] and target.read_text() == "bye\n"
        update = next(f for f in frames if f["type"] == "tool_update")
        assert update["kind"] == "diff" and "+bye" in update["chunk"]
        c.send("approval", callId=asked["callId"], decision="allow")  # answered already
        assert "no call" in c.until("error")[-1]["message"]


def test_always_allow_skips_the_card_until_revoked(scripted, ws):
    srv, plugin = scripted
    target = ws / "b.txt"
    target.write_text("one\n")
    with coding_client(srv, ws) as c:
        script(plugin, call("edit", path="b.txt", old_string="one", new_string="two"))
        c.send("prompt", text="edit")
        asked = approval_request(c)
        assert "-one\n+two\n" in asked["preview"]["diff"]
        c.send("approval", callId=asked["callId"], decision="allow", alwaysAllow=True)
        assert c.until("tool_approvals")[-1]["alwaysAllow"] == ["edit"]
        assert ends(finish(c))[0]["ok"] and target.read_text() == "two\n"
        assert approvals(srv) == ["edit"]

        script(plugin, call("edit", path="b.txt", old_string="two", new_string="three"))
        frames = c.turn(text="edit again")
        assert not [f for f in frames if f["type"] == "tool_approval_request"]
        assert ends(frames)[0]["ok"] and target.read_text() == "three\n"

        r = httpx.request("DELETE", srv.base_url + "/api/settings/tool-approvals",
                          json={"tool": "edit"})
        assert r.json()["alwaysAllow"] == []
        script(plugin, call("edit", path="b.txt", old_string="three", new_string="four"))
        c.send("prompt", text="once more")
        asked = approval_request(c)
        c.send("approval", callId=asked["callId"], decision="deny")
        finish(c)
        assert target.read_text() == "three\n"


def test_several_waiting_calls_form_a_queue(scripted, ws):
    srv, plugin = scripted
    with coding_client(srv, ws) as c:
        script(plugin, call("write", path="x.txt", content="x") + "\n"
               + call("bash", command="echo made > y.txt; pwd"))
        c.send("prompt", text="two things")
        first = approval_request(c)
        second = approval_request(c)
        assert second["preview"]["shell"] == "bash -c"
        queue = c.until("queue_update")[-1]
        assert [q["callId"] for q in queue["approvals"]] == [first["callId"], second["callId"]]
        c.send("approval", callId=second["callId"], decision="allow")
        c.send("approval", callId=first["callId"], decision="deny")
        frames = finish(c)
        results = {e["callId"]: e for e in ends(frames)}
        assert not results[first["callId"]]["ok"] and not (ws / "x.txt").exists()
        ran = results[second["callId"]]["result"]
        assert ran["exitCode"] == 0 and ran["output"].strip() == os.path.realpath(ws)
        assert (ws / "y.txt").read_text() == "made\n"
        queues = [f["approvals"] for f in frames if f["type"] == "queue_update"]
        assert queues[-1] == []


def test_paths_that_leave_the_workspace_are_refused(scripted, ws, tmp_path):
    srv, plugin = scripted
    outside = tmp_path / "outside.txt"
    outside.write_text("private TOPSECRET\n")
    (ws / "link").symlink_to(outside)
    (ws / "dirlink").symlink_to(tmp_path)
    (ws / "sub").mkdir()
    attacks = [call("read", path="../outside.txt"), call("read", path=str(outside)),
               call("read", path="link"), call("read", path="dirlink/outside.txt"),
               call("ls", path="/"), call("grep", pattern="private", path=".."),
               call("write", path="link", content="pwned"),
               call("write", path="sub/../../outside.txt", content="pwned"),
               call("edit", path="dirlink/outside.txt", old_string="private", new_string="x"),
               call("bash", command="pwd", cwd=str(tmp_path)),
               call("bash", command="pwd", cwd="dirlink")]
    with coding_client(srv, ws) as c:
        script(plugin, "\n".join(attacks))
        c.send("prompt", text="escape")  # refused outright: never an approval card
        frames = frames_until(c, "turn_end", "tool_approval_request") + c.until("history")
        results = ends(frames)
        assert len(results) == len(attacks)
        assert all(not e["ok"] and "workspace" in e["result"]["error"] for e in results)
        assert "TOPSECRET" not in json.dumps(frames)
        assert outside.read_text() == "private TOPSECRET\n"

        script(plugin, call("grep", pattern="private"), call("ls"))
        frames = c.turn(text="search inside")
        searched = ends(frames)[0]
        assert searched["ok"] and searched["result"]["matches"] == []  # the link is skipped
        listed = ends(frames)[1]
        assert listed["ok"] and set(listed["result"]["entries"]) >= {"sub/", "link"}


def test_a_command_runs_in_the_workspace_scrubbed_and_is_killed_on_timeout(scripted, ws):
    srv, plugin = scripted
    os.environ["MLXBUN_CODING_SECRET"] = "s3cret"
    try:
        with coding_client(srv, ws) as c:
            script(plugin, call("bash", command="sleep 60 & echo $! > pid; env; wait",
                                timeout=1) + call("bash", command="yes | head -c 200000"))
            c.send("prompt", text="run")
            asked = approval_request(c)
            started = time.monotonic()
            c.send("approval", callId=asked["callId"], decision="allow")
            asked2 = approval_request(c)
            c.send("approval", callId=asked2["callId"], decision="allow")
            frames = finish(c)
            timed, capped = (e["result"] for e in ends(frames))
    finally:
        del os.environ["MLXBUN_CODING_SECRET"]
    assert time.monotonic() - started < 20
    assert timed["timedOut"] and "s3cret" not in timed["output"]
    assert f"HOME={os.path.realpath(ws)}" in timed["output"]
    child = int((ws / "pid").read_text())
    time.sleep(0.2)
    assert not alive(child)  # the background child died with its process group
    assert capped["truncated"] and len(capped["output"]) == 64 * 1024


def test_coding_tools_are_never_offered_to_a_remote_client(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this picks the outward address
        host = s.getsockname()[0]
    if host.startswith("127."):
        pytest.fail("this machine has no address but loopback to test a remote client with")
    srv = start_server(tiny_checkpoint("qwen3"), host=host, api_key="k", sessions_dir=tmp_path)
    try:
        with ChatClient(f"http://{host}:{srv.port}", api_key="k") as c:
            assert c.hello()["coding_tools"]["available"] is False
            c.send("set_coding_tools", enabled=True, workspace=str(tmp_path))
            err = refused(c)
            assert err["status"] == 403 and "loopback" in err["message"]
    finally:
        srv.stop()


def test_stop_denies_waiting_calls_and_kills_a_running_command(scripted, ws):
    srv, plugin = scripted
    with coding_client(srv, ws) as c:
        script(plugin, call("bash", command="sleep 30") + call("write", path="z", content="z"))
        c.send("prompt", text="slow")
        asked = approval_request(c)
        approval_request(c)
        c.send("approval", callId=asked["callId"], decision="allow")
        c.until("tool_update")  # the command line: it runs now
        started = time.monotonic()
        c.send("abort")
        frames = finish(c)
        assert time.monotonic() - started < 10
        stopped, denied = ends(frames)
        assert "stopped" in stopped["result"]["error"]
        assert "the turn was stopped" in denied["result"]["error"]
        assert not (ws / "z").exists()


def test_a_catastrophic_grep_pattern_neither_freezes_the_server_nor_hangs(scripted, ws):
    """``(a+)+$`` over 27 a's and a '!' took Python's re 23 s, with the GIL held: every
    other request waited. The grep must answer at once and /health stay fast meanwhile."""
    srv, plugin = scripted
    (ws / "a.txt").write_text("a" * 27 + "!\n")
    with coding_client(srv, ws) as c:
        script(plugin, call("grep", pattern="(a+)+$"))
        started = time.monotonic()
        c.send("prompt", text="search")
        worst = 0.0
        while time.monotonic() - started < 3:  # the turn and its grep run meanwhile
            asked = time.monotonic()
            assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
            worst = max(worst, time.monotonic() - asked)
        end = ends(finish(c))[0]
    assert worst < 2.0, f"/health took {worst:.1f} s while the grep ran"
    assert end["ok"] and end["result"] == {"matches": [], "truncated": False}
    assert time.monotonic() - started < 15


def test_every_descendant_ends_with_its_command_even_outside_its_group(scripted, ws):
    """``setsid`` and a double fork leave the command's process group; they must end
    with the command all the same, whether it exits on its own or times out."""
    srv, plugin = scripted
    daemons = ("setsid sleep 120 & echo $! > a.pid; "
               "(setsid sh -c 'sleep 120 & echo $! > b.pid' &); "  # the middle shell exits
               "setsid sleep 120 >/dev/null 2>&1 </dev/null & echo $! > c.pid; "
               "sleep 0.5; echo started")
    with coding_client(srv, ws) as c:
        script(plugin, call("bash", command=daemons, timeout=20)
               + call("bash", command="setsid sleep 120 & echo $! > d.pid; sleep 60",
                      timeout=2))
        c.send("prompt", text="start daemons")
        first = c.until("tool_approval_request")[-1]
        second = c.until("tool_approval_request")[-1]
        started = time.monotonic()
        c.send("approval", callId=first["callId"], decision="allow")
        c.send("approval", callId=second["callId"], decision="allow")
        exited, timed = (e["result"] for e in ends(finish(c)))
    assert time.monotonic() - started < 12  # the first did not wait for its 20 s timeout
    assert exited["exitCode"] == 0 and exited["output"] == "started\n" and not exited["timedOut"]
    assert timed["timedOut"]
    time.sleep(0.2)
    for name in ("a", "b", "c", "d"):
        pid = int((ws / f"{name}.pid").read_text())
        assert not alive(pid), f"{name}: {pid} outlived its command"


SHELL_IN_A_PROCESS_WITH_SECRETS = """
import asyncio, json, sys
from pathlib import Path
from mlxbun_core.webchat.coding import shell
from mlxbun_core.webchat.coding.workspace import Workspace

async def main():
    async def chunk(text):
        pass
    command = "tr '\\\\0' '\\\\n' < /proc/$PPID/environ; echo ---; env"
    return await shell.run(Workspace(Path(sys.argv[1])), {"command": command}, chunk)

print(json.dumps(asyncio.run(main())))
"""


def test_a_command_and_its_parent_process_hold_no_secrets(tmp_path):
    """``cat /proc/$PPID/environ`` printed the server's MLXBUN_API_KEY: the command's
    parent must be a process started without the server's environment."""
    secrets = {"MLXBUN_API_KEY": "sk-mlxbun-key", "HF_TOKEN": "hf_token_value",
               "AWS_SECRET_ACCESS_KEY": "aws-secret-value"}
    r = subprocess.run([sys.executable, "-c", SHELL_IN_A_PROCESS_WITH_SECRETS, str(tmp_path)],
                       env={**os.environ, **secrets}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    parent, _, own = result["output"].partition("---\n")
    assert f"HOME={os.path.realpath(tmp_path)}" in parent  # the parent's environment was read
    assert f"HOME={os.path.realpath(tmp_path)}" in own
    for value in secrets.values():
        assert value not in result["output"]
    assert "MLXBUN_" not in result["output"]  # MLXBUN_HOME and the rest stay out too


def test_names_and_control_characters_cannot_forge_the_approval_card(scripted, ws):
    """A file name with a newline wrote a fake ``+++ b/harmless.txt`` line into the card's
    diff; names are quoted as git quotes them, and control characters shown escaped."""
    srv, plugin = scripted
    name = "notes.txt\n+++ b/harmless.txt"
    (ws / "sub\ndir").mkdir()
    with coding_client(srv, ws) as c:
        script(plugin, call("write", path=name, content="one\x1b[2K\rtwo \u202etxt.exe\n")
               + call("bash", command="echo safe\rrm -rf ~", cwd="sub\ndir"))
        c.send("prompt", text="write it")
        write = c.until("tool_approval_request")[-1]
        bash = c.until("tool_approval_request")[-1]
        for asked in (write, bash):
            c.send("approval", callId=asked["callId"], decision="deny")
        finish(c)
    diff = write["preview"]["diff"].split("\n")
    assert write["preview"]["path"] == '"notes.txt\\n+++ b/harmless.txt"'
    assert [line for line in diff if line.startswith(("---", "+++"))] == [
        "--- /dev/null", '+++ "b/notes.txt\\n+++ b/harmless.txt"']
    assert "+one\\x1b[2K\\rtwo \\u202etxt.exe" in diff
    assert bash["preview"]["command"] == "echo safe\\rrm -rf ~"
    assert bash["preview"]["cwd"] == '"sub\\ndir"'
    assert not (ws / name).exists()


def test_a_large_diff_is_made_off_the_event_loop(scripted, ws):
    """Planning an edit diffs the file: on the event loop, difflib over 75,000 changed lines
    held /health 3.8 s. The diff is made on a worker thread, and only the changed region's
    first 5,000 lines go to difflib (the card shows 64 KiB)."""
    srv, plugin = scripted
    rng = random.Random(0)
    (ws / "big.txt").write_text("".join(f"line {rng.random():.16f}\n" for _ in range(75000)))
    with coding_client(srv, ws) as c:  # every line changes: 75,000 lines (2 MB) for difflib
        script(plugin, call("edit", path="big.txt", old_string="line", new_string="LINE",
                            replace_all=True))
        started = time.monotonic()
        c.send("prompt", text="rewrite it")
        worst = 0.0
        while time.monotonic() - started < 6:
            asked = time.monotonic()
            assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
            worst = max(worst, time.monotonic() - asked)
        asked = c.until("tool_approval_request")[-1]
        c.send("approval", callId=asked["callId"], decision="deny")
        finish(c)
    assert asked["preview"]["diff"].endswith("… (cut)\n")
    assert worst < 2.0, f"/health took {worst:.1f} s while the diff was made"
