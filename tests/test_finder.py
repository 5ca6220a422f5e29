"""One way to find or start a server (``console/finder.py``), used by ``mlxbun chat`` and
``mlxbun launch`` alike: what a probe says of a real server (its model and window, a key
it wants, a model it does not serve, nothing listening), and a started one in its own
session, logged, stopped."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from mlxbun_core import launch
from mlxbun_core.console import chat, finder
from mlxbun_core.console.finder import NoServer, probe
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import free_port, running_server


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=21)


def test_chat_and_launch_share_the_finder():
    assert launch.probe is finder.probe and launch.Server is finder.Server
    assert chat.find_or_start is finder.find_or_start
    assert not hasattr(launch, "start_server") and not hasattr(launch, "stop_server")


def test_a_probe_names_the_served_row_and_its_window(ckpt):
    with running_server(ckpt, max_tokens=4) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        found = probe(url)
        assert found is not None and found.model == srv.engine.model.id
        assert found.context_window == srv.engine.model.context_window
        assert probe(url, wanted=str(ckpt)).model == found.model  # a directory names it
        assert not found.started
        with pytest.raises(NoServer) as other:
            probe(url, wanted="some/other-model")
        assert other.value.status == 2
        assert f"does not serve 'some/other-model' (it serves {found.model})" in str(other.value)
    assert probe(f"http://127.0.0.1:{free_port()}") is None  # nothing listens


def test_a_probe_says_a_server_wants_a_key_and_uses_it(ckpt):
    with running_server(ckpt, max_tokens=4, api_key="sk-find") as srv:
        url = f"http://127.0.0.1:{srv.port}"
        with pytest.raises(NoServer) as refused:
            probe(url)
        assert refused.value.status == 2 and "wants an API key" in str(refused.value)
        found = probe(url, api_key="sk-find")
        assert found is not None and found.api_key == "sk-find"


def test_a_started_server_runs_in_its_own_session_logs_and_stops(ckpt, tmp_path):
    port = free_port()
    said: list[str] = []
    log = tmp_path / "serve.log"
    server = finder.start([str(ckpt), "--port", str(port), "--max-tokens", "4"], port,
                          log=log, say=said.append)
    try:
        assert server.started and server.log_path == log
        assert os.getsid(server.proc.pid) != os.getsid(0)  # the caller's Ctrl-C stays its own
        reply = httpx.post(server.base_url + "/v1/completions",
                           json={"model": server.model, "prompt": "hi", "max_tokens": 2},
                           timeout=120)
        assert reply.status_code == 200
        assert said[0].startswith(f"mlxbun: starting `mlxbun serve {ckpt}")
        assert f"serving {server.model}" in said[-1]
    finally:
        server.stop()
    assert server.proc.returncode in (0, -signal.SIGTERM)
    assert probe(server.base_url) is None
    assert f"serving {Path(ckpt).name}" in log.read_text()
