"""`mlxbun serve` start-up as a new user meets it: problems are found before the model loads."""

import os
import socket
import subprocess
import sys

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import serve
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


def test_serves_on_the_port_it_probed():
    with serve(tiny_checkpoint("llama", seed=3), ready=None) as proc:
        proc.wait_for_line("serving", 120)  # the banner comes after the load
        r = proc.wait_for_http(proc.base + "/health", 30)
        assert r.json() == {"status": "ok"}
        with socket.socket() as again:  # held by the server now
            assert again.connect_ex(("127.0.0.1", proc.port)) == 0
