"""MCP tools in the web chat: servers from a real mlxbun.yaml, a small MCP server of our own
(tests/mcp_fixture_server.py, the SDK's MCPServer) as a real subprocess over stdio and over
streamable HTTP, driven through the real /ws/chat socket and engine (a scripted model
writes the tool calls)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from mlxbun_core import cli
from mlxbun_core.config import ConfigError
from mlxbun_core.config.schema import serve_options
from mlxbun_core.config.yamlfile import read_config
from mlxbun_core.testing.server import free_port
from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webapp.state import of as web_state
from scripted_model import scripted_server

FIXTURE = Path(__file__).with_name("mcp_fixture_server.py")
BROKEN = "import sys; sys.stderr.write('broken: no config file'); sys.exit(2)"
STUCK = ("import os, sys, time; open(sys.argv[1], 'a').write(str(os.getpid()) + chr(10)); "
         "time.sleep(600)")  # a server that never answers its handshake; its pid, per start
STALL_S = 30.0  # a turn that says nothing for this long has hung


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def read_yaml(path: Path, text: str):
    path.write_text(textwrap.dedent(text))
    return read_config(path, serve_options(cli.build_parser()))


def wait_for_port(port: int, proc: subprocess.Popen, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the HTTP MCP fixture server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the HTTP MCP fixture server did not listen")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The scripted chat server with four MCP servers: the fixture over stdio (2 s per
    call, 1000 characters of output) and over HTTP, one that exits at start and one that
    never answers its handshake."""
    tmp = tmp_path_factory.mktemp("mcp")
    logs = {"stdio": tmp / "stdio.log", "web": tmp / "web.log", "stuck": tmp / "stuck.pid"}
    port = free_port()
    web = subprocess.Popen([sys.executable, str(FIXTURE), "http", str(port)],
                           env={**os.environ, "FIXTURE_LOG": str(logs["web"])},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, web)
        config = read_yaml(tmp / "mlxbun.yaml", f"""
            mcp_servers:
              stdio:
                command: {sys.executable}
                args: ["{FIXTURE}", stdio]
                env: {{FIXTURE_LOG: "{logs['stdio']}"}}
                timeout: 2
                max_output: 1000
              web:
                url: http://127.0.0.1:{port}/mcp
                headers: {{X-Fixture: "1"}}
              broken:
                command: {sys.executable}
                args: ["-c", "{BROKEN}"]
              stuck:
                command: {sys.executable}
                args: ["-c", "{STUCK}", "{logs['stuck']}"]
                startup_timeout: 2
            """)
        with scripted_server("", name="scripted-mcp") as (srv, plugin):
            web_state(srv.server.config.app).mcp_servers = config.mcp_servers
            yield srv, plugin, logs
    finally:
        web.kill()
        web.wait()


def script(plugin, *replies: str) -> None:
    queue = list(replies)
    plugin.reply = lambda prompt: queue.pop(0) if queue else "Done."


def frames_until(c: ChatClient, kind: str, *fail_on: str) -> list:
    out: list = []
    while True:
        try:
            frame = c.recv(STALL_S)
        except TimeoutError:
            raise AssertionError(f"no {kind} frame for {STALL_S:.0f} s; last: {out[-3:]}") \
                from None
        out.append(frame)
        if frame["type"] == kind:
            return out
        assert frame["type"] not in fail_on, f"{frame} came before any {kind}"


def finish(c: ChatClient) -> list:
    return frames_until(c, "turn_end") + frames_until(c, "history")


def ends(frames: list) -> list:
    return [f for f in frames if f["type"] == "tool_end"]


def status(frames: list) -> dict:
    last = [f for f in frames if f["type"] == "mcp_status"][-1]
    return {s["name"]: s for s in last["servers"]}


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("server", ["stdio", "web"])
def test_tools_are_offered_and_an_approved_call_answers(setup, server):
    srv, plugin, logs = setup
    script(plugin, call(f"{server}__echo", text="hi there"))
    with ChatClient(srv.base_url) as c:
        hello = c.hello()
        assert {s["name"] for s in hello["mcp_status"]["servers"]} == {
            "stdio", "web", "broken", "stuck"}
        c.send("prompt", text="say hi through the tool")
        frames = frames_until(c, "tool_approval_request", "turn_end")
        card = frames[-1]
        assert card["tool"] == f"{server}__echo" and card["args"] == {"text": "hi there"}
        assert card["preview"]["server"] == server and card["preview"]["tool"] == "echo"
        assert '"hi there"' in card["preview"]["arguments"]
        servers = status(c.seen)
        assert servers["stdio"]["state"] == servers["web"]["state"] == "ready"
        assert "stdio__big" in servers["stdio"]["tools"] and "web__hang" in servers["web"]["tools"]
        assert servers["broken"]["state"] == "failed"
        assert "broken: no config file" in servers["broken"]["error"]
        assert servers["stuck"]["state"] == "failed"
        assert "did not start within 2 s" in servers["stuck"]["error"]
        # the model was offered the MCP tools beside the app tools
        assert f"{server}__echo" in plugin.prompts[0] and "stdio__hang" in plugin.prompts[0]
        assert "hi there" not in "".join(log_lines(logs[server]))  # it waits for the user
        c.send("approval", callId=card["callId"], decision="allow")
        frames = finish(c)
    end = ends(frames)[0]
    assert end["ok"] and end["result"] == {"content": "echo: hi there"}
    assert "echo hi there" in log_lines(logs[server])
    assert "echo: hi there" in plugin.prompts[-1]  # the answer went back to the model


def test_a_failed_start_is_not_retried_at_once_and_leaves_no_process(setup):
    srv, plugin, logs = setup
    script(plugin, "No tools needed.")
    with ChatClient(srv.base_url) as c:
        c.hello()
        for _ in range(2):
            frames = c.turn(text="hello")
            assert frames[-2]["type"] == "turn_end" or frames[-1]["type"] == "history"
    assert status(c.seen)["stuck"]["state"] == "failed"
    pids = [int(line) for line in log_lines(logs["stuck"])]
    assert len(pids) == 1  # started once: a failed start waits before another try
    deadline = time.monotonic() + 10
    while alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pids[0]), "the stuck server's process outlived its failed start"


def test_a_denied_call_never_reaches_the_server(setup):
    srv, plugin, logs = setup
    script(plugin, call("stdio__echo", text="secret words"))
    with ChatClient(srv.base_url) as c:
        c.hello()
        c.send("prompt", text="echo it")
        card = frames_until(c, "tool_approval_request", "turn_end")[-1]
        c.send("approval", callId=card["callId"], decision="deny")
        frames = finish(c)
    end = ends(frames)[0]
    assert not end["ok"] and "denied" in end["result"]["error"]
    assert "echo secret words" not in log_lines(logs["stdio"])


def test_always_allow_skips_the_card_for_that_tool_only(setup):
    srv, plugin, logs = setup
    script(plugin, call("web__echo", text="one"))
    with ChatClient(srv.base_url) as c:
        c.hello()
        c.send("prompt", text="echo one")
        card = frames_until(c, "tool_approval_request", "turn_end")[-1]
        c.send("approval", callId=card["callId"], decision="allow", alwaysAllow=True)
        frames = finish(c)
        assert "web__echo" in [f for f in frames if f["type"] == "tool_approvals"][-1][
            "alwaysAllow"]
        script(plugin, call("web__echo", text="two"))
        frames = c.turn(text="echo two")
        assert not [f for f in frames if f["type"] == "tool_approval_request"]
        assert ends(frames)[0]["result"] == {"content": "echo: two"}
        script(plugin, call("web__big", n=5))
        c.send("prompt", text="another tool")
        card = frames_until(c, "tool_approval_request", "turn_end")[-1]
        assert card["tool"] == "web__big"
        c.send("approval", callId=card["callId"], decision="deny")
        finish(c)
    # the grant lives in the suite's shared home: take it back for the tests that follow
    r = httpx.request("DELETE", srv.base_url + "/api/settings/tool-approvals",
                      json={"tool": "web__echo"})
    assert "web__echo" not in r.json()["alwaysAllow"]


def test_a_hanging_tool_times_out_and_the_server_still_answers(setup):
    srv, plugin, logs = setup
    script(plugin, call("stdio__hang"), call("stdio__echo", text="after the hang"))
    with ChatClient(srv.base_url) as c:
        c.hello()
        c.send("prompt", text="hang then echo")
        card = frames_until(c, "tool_approval_request", "turn_end")[-1]
        started = time.monotonic()
        c.send("approval", callId=card["callId"], decision="allow")
        frames = frames_until(c, "tool_end")
        waited = time.monotonic() - started
        end = frames[-1]
        assert not end["ok"] and "did not answer within 2 s" in end["result"]["error"]
        assert waited < 15
        card = frames_until(c, "tool_approval_request", "turn_end")[-1]
        c.send("approval", callId=card["callId"], decision="allow")
        frames = finish(c)
    assert ends(frames)[0]["ok"] and ends(frames)[0]["result"]["content"] == "echo: after the hang"


def test_output_is_capped(setup):
    srv, plugin, logs = setup
    script(plugin, call("stdio__big", n=50000))
    with ChatClient(srv.base_url) as c:
        c.hello()
        c.send("prompt", text="big")
        card = frames_until(c, "tool_approval_request", "turn_end")[-1]
        c.send("approval", callId=card["callId"], decision="allow")
        frames = finish(c)
    result = ends(frames)[0]["result"]
    assert result["content"] == "x" * 1000
    assert "first 1000 of 50000 characters" in result["note"]
    assert "x" * 1001 not in plugin.prompts[-1]


def test_a_crashed_server_is_reported_and_started_again(setup):
    srv, plugin, logs = setup
    script(plugin, call("stdio__crash"))
    with ChatClient(srv.base_url) as c:
        c.hello()
        c.send("prompt", text="crash it")
        card = frames_until(c, "tool_approval_request", "turn_end")[-1]
        c.send("approval", callId=card["callId"], decision="allow")
        frames = finish(c)
        end = ends(frames)[0]
        assert not end["ok"] and "stopped during the call" in end["result"]["error"]
        assert "fixture crashing on purpose" in end["result"]["error"]
        assert status(c.seen)["stdio"]["state"] == "failed"
        assert frames[-1]["type"] == "history"  # the turn ended; the socket still works

        pids = [line for line in log_lines(logs["stdio"]) if line.startswith("pid ")]
        script(plugin, call("stdio__echo", text="back again"))
        c.send("prompt", text="and now")
        frames = frames_until(c, "tool_approval_request", "turn_end")
        assert status(c.seen)["stdio"]["state"] == "ready"
        assert "fixture crashing on purpose" in status(c.seen)["stdio"]["lastFailure"]
        c.send("approval", callId=frames[-1]["callId"], decision="allow")
        frames = finish(c)
    assert ends(frames)[0]["result"] == {"content": "echo: back again"}
    assert len([ln for ln in log_lines(logs["stdio"]) if ln.startswith("pid ")]) == len(pids) + 1


def test_the_hub_stops_its_processes(tmp_path):
    """Shutdown (the app's on_stop closes the hub): a stdio server's process ends."""
    from mlxbun_core.config.mcp import McpServerSpec
    from mlxbun_core.webchat.mcp.hub import McpHub

    log = tmp_path / "log"
    spec = McpServerSpec("fx", 1, command=sys.executable, args=(str(FIXTURE), "stdio"),
                         env={"FIXTURE_LOG": str(log)})

    async def run() -> int:
        hub = McpHub([spec])
        await hub.prepare()
        assert sorted(hub.tools()) == ["fx__big", "fx__crash", "fx__echo", "fx__hang"]
        pid = int(log.read_text().split()[1])
        assert alive(pid)
        await hub.close()
        assert hub.status()[0]["state"] == "stopped"
        return pid

    pid = asyncio.run(run())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


@pytest.mark.parametrize("body, message", [
    ("a__b:\n    command: x\n", "single _"),
    ("a:\n    command: x\n    url: http://h/mcp\n", "not both"),
    ("a:\n    args: [x]\n", "needs command"),
    ("a:\n    url: ftp://h\n", "http:// or https://"),
    ("a:\n    url: http://h/mcp\n    env: {A: b}\n", "env does not go with url"),
    ("a:\n    command: x\n    timeout: 0\n", "number of seconds"),
    ("a:\n    command: x\n    colour: red\n", "unknown setting mcp_servers.a.colour"),
])
def test_config_mistakes_name_their_line(tmp_path, body, message):
    with pytest.raises(ConfigError) as err:
        read_yaml(tmp_path / "mlxbun.yaml", "mcp_servers:\n  " + body)
    assert message in str(err.value)
    assert re.search(r"mlxbun\.yaml:[234]: ", str(err.value)), str(err.value)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_timed_out_call_is_cancelled_on_the_server(tmp_path, transport):
    """Past its timeout a call is given up and the server is told so: it gets MCP's
    ``notifications/cancelled`` for that request id and stops the tool, and keeps serving."""
    from mlxbun_core.config.mcp import McpServerSpec
    from mlxbun_core.webchat.apptools import ToolFailed
    from mlxbun_core.webchat.mcp.client import McpServer

    log = tmp_path / "log"
    env = {"FIXTURE_LOG": str(log)}
    web = None
    if transport == "http":
        port = free_port()
        web = subprocess.Popen([sys.executable, str(FIXTURE), "http", str(port)],
                               env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        wait_for_port(port, web)
        spec = McpServerSpec("fx", 1, url=f"http://127.0.0.1:{port}/mcp", timeout=1)
    else:
        spec = McpServerSpec("fx", 1, command=sys.executable, args=(str(FIXTURE), "stdio"),
                             env=env, timeout=1)

    async def run() -> list[str]:
        server = McpServer(spec)
        server.start()
        await server.wait_ready(60)
        assert server.state == "ready", server.error
        try:
            with pytest.raises(ToolFailed, match="did not answer within 1 s"):
                await server.call(server.tools["fx__hang"], {})
            deadline = time.monotonic() + 10
            while not any(line.endswith(" cancelled")
                          for line in log_lines(log)) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            lines = log_lines(log)  # read while the connection is still open
            assert (await server.call(server.tools["fx__echo"], {"text": "still here"})
                    )["content"] == "echo: still here"
            return lines
        finally:
            await server.stop()

    try:
        lines = asyncio.run(run())
    finally:
        if web is not None:
            web.kill()
            web.wait()
    started = [line.split()[1] for line in lines if re.fullmatch(r"hang \S+", line)]
    assert len(started) == 1, lines
    assert f"hang {started[0]} cancelled" in lines, lines
