"""The web page under ``serve --isolate``: a real parent process with a real engine child,
and headless Chromium. Chat needs an in-process engine, so the page must say so once,
disable what needs the chat, and never open (or retry) a socket bound to be refused."""

from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.server import free_port

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolated")
    port = free_port()
    env = {**os.environ, "MLXBUN_HOME": str(root / "home"), "HF_HOME": str(root / "hf"),
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", "--isolate", "--port", str(port),
           "--model", str(tiny_checkpoint("qwen3"))]
    with ServerProcess(cmd, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        proc.wait_for_http(base + "/engine", 60)
        deadline = time.monotonic() + 120
        while httpx.get(base + "/engine").json()["state"] != "ready":
            assert time.monotonic() < deadline, proc.output
            time.sleep(0.2)
        yield proc, base


def test_the_page_says_once_that_chat_needs_a_non_isolated_server(page, isolated):
    proc, base = isolated
    sockets = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(base + "/")
    banner = page.wait_for_selector("#error:not([hidden])")
    assert "--isolate" in banner.inner_text()
    page.wait_for_selector("#conn[data-state=refused]")
    assert page.inner_text("#conn") == "chat unavailable"
    for control in ("#composer-input", "#send", "#attach", "#new-session", "#session-search"):
        assert page.is_disabled(control), control
    assert "--isolate" in page.inner_text("#session-list")  # not an empty list
    page.wait_for_timeout(2500)  # a retry loop (0.5 s, 1 s, 2 s backoff) would show by now
    assert page.is_visible("#error") and "--isolate" in page.inner_text("#error")  # it stays
    assert sockets == []
    page.click("nav >> text=Status")  # the rest of the page works
    page.wait_for_selector("#status-model table")
    assert page.console.errors == []
    assert not [line for line in proc.lines if "handshake" in line or "ERROR" in line]
