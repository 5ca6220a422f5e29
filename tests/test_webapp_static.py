"""The web app's static shell over real HTTP: routes, cache headers, the service worker's
cache list, redirects, and that everything the page loads ships inside the package."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.webapp import pages as web
from mlxbun_core.webchat.conversation import Conversation

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "mlxbun_core" / "web"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(tiny_checkpoint("qwen3"), sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


def test_shell_routes_and_cache_headers(server):
    base = server.base_url
    page = httpx.get(base + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    for path in ("/assets/app.js", "/assets/vendor/marked.esm.js", "/assets/app.css",
                 "/assets/icon.svg", "/manifest.webmanifest"):
        r = httpx.get(base + path)
        assert r.status_code == 200 and r.headers["cache-control"] == "public, max-age=3600", path
    assert httpx.get(base + "/assets/icon.svg").headers["content-type"] == "image/svg+xml"
    manifest = httpx.get(base + "/manifest.webmanifest")
    assert manifest.headers["content-type"] == "application/manifest+json"
    assert {"name", "start_url", "display", "icons"} <= set(manifest.json())
    sw = httpx.get(base + "/sw.js")
    assert sw.headers["cache-control"] == "no-store" and "javascript" in sw.headers["content-type"]
    for path in ("/assets/nope.js", "/assets/../index.html", "/assets/%2e%2e/sw.js", "/assets/"):
        assert httpx.get(base + path).status_code == 404, path


def test_the_service_worker_caches_only_the_shell(server):
    text = httpx.get(server.base_url + "/sw.js").text
    shell = json.loads(re.search(r"const SHELL = (\[.*?\]);", text).group(1))
    assert shell[0] == "/" and all(p.startswith("/assets/") for p in shell[1:])
    assert "/assets/app.js" in shell and "/assets/vendor/hljs.css" in shell
    assert not [p for p in shell if p.startswith(("/api", "/v1", "/ws", "/stats", "/fit"))]
    version = re.search(r'const VERSION = "([0-9a-f]{16})"', text).group(1)
    files = web.load_files()
    files["/assets/app.css"] += b"/* changed */"
    assert version not in web.service_worker(files).decode()  # a changed shell is a new cache


def test_legacy_pages_redirect_to_hash_routes(server):
    for route in ("status", "chat"):
        r = httpx.get(f"{server.base_url}/{route}")
        assert r.status_code == 302 and r.headers["location"] == f"/#{route}"


def test_everything_the_page_loads_is_shipped_and_packaged():
    files = web.load_files()
    html = files["/index.html"].decode()
    wanted = set(re.findall(r'(?:src|href)="(/[^"#]*)"', html))
    for path, body in files.items():
        if path.endswith(".js") and path.startswith("/assets/") and "/vendor/" not in path:
            for spec in re.findall(r'from "(\./[^"]+)"', body.decode()):
                wanted.add(str(Path(path).parent / spec[2:]))
    wanted -= {"/", "/curves"}  # page routes, not files (/curves serves curves.html)
    assert wanted and not sorted(wanted - set(files)), "the page references files that do not exist"
    assert not re.search(r'(?:src|href)="https?:', html), "no CDN: everything is same-origin"
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["mlxbun_core"]
    for path in WEB.rglob("*"):
        if path.is_file():
            rel = str(path.relative_to(ROOT / "mlxbun_core"))
            packaged = any(fnmatch.fnmatch(rel, p) and rel.count("/") == p.count("/")
                           for p in patterns)
            assert packaged, f"{rel} is not package data: pip-installed servers would miss it"


def test_the_page_url_and_when_to_open_a_browser():
    assert web.page_url("0.0.0.0", 8080) == "http://127.0.0.1:8080/"
    assert web.page_url("::", 80) == "http://[::1]:80/"
    assert web.page_url("192.168.1.5", 9000) == "http://192.168.1.5:9000/"
    assert web.interactive_start(no_open=True) is False
    assert web.interactive_start(no_open=False) is False  # stdout is captured, and this is a test


def test_a_turn_body_carries_the_session_settings():
    conversation = Conversation(engine=None, store=None, send=None, ready={})
    conversation.draft_settings = {"systemPrompt": "Be brief.", "thinking": False,
                                   "adapter": "pirate",
                                   "sampling": {"temperature": 0.5, "max_tokens": 9}}
    conversation.next_turn = {"max_tokens": 3}
    conversation.app_context = {"route": "status", "snapshot": {"route": "status", "elements": []}}
    body = conversation.request_body([{"role": "user", "content": "hi"}])
    assert body["messages"][0] == {"role": "system", "content": "Be brief.\n\n[user is on: Status]"}
    assert body["temperature"] == 0.5 and body["max_tokens"] == 3 and body["stream"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["adapter"] == "pirate"
    assert [t["function"]["name"] for t in body["tools"]] == [
        "get_current_app_context", "navigate_app", "spotlight_ui", "memory_search"]


def serve_in_a_terminal(tmp_path, *flags):
    """``mlxbun serve`` with its stdout on a pseudo-terminal (an interactive start), outside
    pytest's environment, with $BROWSER a command that writes the URL it is given to a file."""
    import os
    import pty
    import subprocess
    import sys

    from mlxbun_core.testing.server import free_port

    tmp_path.mkdir()
    marker = tmp_path / "opened.txt"
    opener = tmp_path / "opener.py"
    opener.write_text("import pathlib, sys\npathlib.Path(sys.argv[2]).write_text(sys.argv[1])\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", "CI", "MLXBUN_NO_OPEN")}
    env.update(BROWSER=f"{sys.executable} {opener} %s {marker}", MLXBUN_HOME=str(tmp_path / "home"))
    port = free_port()
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mlxbun_core.cli", "serve",
                             str(tiny_checkpoint("qwen3")), "--port", str(port), *flags],
                            stdin=subprocess.DEVNULL, stdout=secondary, stderr=subprocess.DEVNULL,
                            env=env)
    os.close(secondary)
    return proc, primary, port, marker


def stop(proc, primary):
    import os
    import signal

    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    os.close(primary)


def test_an_interactive_start_opens_the_page(tmp_path):
    """(``--no-open`` and non-terminal starts: ``interactive_start`` above.)"""
    import time

    proc, primary, port, marker = serve_in_a_terminal(tmp_path / "a")
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert marker.read_text() == f"http://127.0.0.1:{port}/"
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
    finally:
        stop(proc, primary)
