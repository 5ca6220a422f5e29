"""`mlxbun serve` start-up as a new user meets it: problems are found before the model loads."""

import os
import queue
import socket
import subprocess
import sys
import threading
import time

import httpx

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import free_port

CLI = [sys.executable, "-m", "mlxbun_core.cli"]


def run_cli(args, *, pre: str = "", timeout=120):
    """Run the CLI to its exit; a server that does not exit fails on the timeout."""
    code = f"{pre}\nimport sys\nfrom mlxbun_core.cli import main\nsys.exit(main({args!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "MLXBUN_LOG_LEVEL": "info"})


def test_busy_port_exits_2_before_loading_the_model():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_cli(["serve", str(tiny_checkpoint("llama", seed=3)), "--port", str(port)])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr
    assert "--port" in r.stderr  # says how to fix it
    # the probe came first: no banner, and the loader never ran
    assert "serving" not in r.stdout and "loading" not in r.stderr


def test_unusable_host_or_port_exits_2():
    r = run_cli(["serve", "--port", "70000"])
    assert r.returncode == 2 and "cannot listen on 127.0.0.1:70000" in r.stderr


def test_a_cors_value_that_is_no_origin_exits_2_before_loading():
    r = run_cli(["serve", "--cors", "app.example/path", "--port", str(free_port())])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--cors 'app.example/path': expected an origin" in r.stderr
    assert "serving" not in r.stdout and "loading" not in r.stderr


def test_missing_grammar_extra_names_the_extra():
    # sys.modules[name] = None is how Python spells "not installed" for find_spec and import
    r = run_cli(["serve", "--grammar-backend", "xgrammar", "--port", str(free_port())],
                pre="import sys; sys.modules['xgrammar'] = None")
    assert r.returncode == 2, r.stderr
    assert "pip install 'mlxbun[xgrammar]'" in r.stderr


def wait_for_line(proc, needle: str, timeout: float) -> str:
    """Output up to the first line holding ``needle``; fails (never hangs) on a silent server."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            break
        if needle in seen[-1]:
            return "".join(seen)
    raise AssertionError(f"no {needle!r} within {timeout}s; output: {''.join(seen)}")


def get_when_listening(url: str, timeout: float = 30.0) -> httpx.Response:
    """The banner is printed just before uvicorn starts listening on the bound socket."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=10)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_serves_on_the_port_it_probed():
    port = free_port()
    ckpt = str(tiny_checkpoint("llama", seed=3))
    proc = subprocess.Popen(CLI + ["serve", ckpt, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(proc, "serving", 120)  # the banner comes after the load
        r = get_when_listening(f"http://127.0.0.1:{port}/health")
        assert r.json() == {"status": "ok"}
        with socket.socket() as again:  # held by the server now
            assert again.connect_ex(("127.0.0.1", port)) == 0
    finally:
        proc.terminate()
        proc.wait(10)
