"""The web app's static shell: GET /, /assets/*, /manifest.webmanifest, /sw.js.

Everything is same-origin and ships inside the wheel (``mlxbun_core/web/``): no CDN
and no build step at run time. Files are read once at start-up into memory, so a
request can only ever name one of them. Legacy page paths redirect to the SPA's
hash routes. The shell holds nothing private, so it answers without the API key
(the page asks for the key when the API wants one).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import webbrowser
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING

from blacksheep import Request, Response
from blacksheep.contents import Content

from ..runconfig import current
from ..server.common import Handler, json_response
from ..webchat.apptools import ROUTES

if TYPE_CHECKING:
    from importlib.abc import Traversable

    import uvicorn

    from ..engine.core import Engine
    from ..server.state import App

ASSET_CACHE = b"public, max-age=3600"
TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
         ".mjs": b"text/javascript; charset=utf-8", ".css": b"text/css; charset=utf-8",
         ".svg": b"image/svg+xml", ".webmanifest": b"application/manifest+json",
         ".txt": b"text/plain; charset=utf-8", ".json": b"application/json"}
# the Curve Designer and its companions (served by .curves when shipped): route -> file
CURVE_PAGES = {"/curves": "/curves.html", "/curve-terrain": "/curve-terrain.html",
               "/dag": "/dag.html"}


# the reference's names for the vendored highlighter (no CDN): URL -> the shipped file
VENDOR_ALIASES = {"/assets/hljs.js": "/assets/vendor/highlight.min.js",
                  "/assets/hljs.css": "/assets/vendor/hljs.css"}


def load_files() -> dict[str, bytes]:
    """Every file of the web app, by URL path (``/assets/app.js``), as bytes."""
    root = resources.files("mlxbun_core") / "web"
    out: dict[str, bytes] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif not child.name.startswith("."):
                out[f"{prefix}{child.name}"] = child.read_bytes()

    walk(root, "/")
    return out


def shell_paths(files: Mapping[str, bytes]) -> list[str]:
    """What the service worker caches: the page and its assets, nothing dynamic."""
    return ["/"] + sorted(p for p in files if p.startswith("/assets/"))


def service_worker(files: Mapping[str, bytes]) -> bytes:
    """sw.js with its cache list and a version that changes whenever a shell file does."""
    paths = shell_paths(files)
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.encode() + b"\0" + files["/index.html" if p == "/" else p])
    text = files["/sw.js"].decode()
    text = text.replace("__SHELL_VERSION__", digest.hexdigest()[:16])
    text = text.replace("__SHELL_FILES__", json.dumps(paths))
    return text.encode()


def _file(body: bytes, path: str, cache: bytes) -> Response:
    ext = path[path.rfind("."):]
    resp = Response(200, None, Content(TYPES.get(ext, b"application/octet-stream"), body))
    resp.add_header(b"Cache-Control", cache)
    resp.add_header(b"X-Content-Type-Options", b"nosniff")
    return resp


def register(app: App, engine: Engine) -> None:
    files = load_files()
    sw = service_worker(files)

    async def index(request: Request) -> Response:
        return _file(files["/index.html"], "/index.html", b"no-cache")

    async def asset(request: Request) -> Response:
        path = request.path
        body = files.get(VENDOR_ALIASES.get(path, path))
        if body is None or not path.startswith("/assets/"):
            return json_response({"error": {"message": "not found", "type": "not_found_error"}},
                                 404)
        return _file(body, path, ASSET_CACHE)

    async def manifest(request: Request) -> Response:
        return _file(files["/manifest.webmanifest"], "/manifest.webmanifest", ASSET_CACHE)

    async def worker(request: Request) -> Response:
        resp = _file(sw, "/sw.js", b"no-store")
        resp.add_header(b"Service-Worker-Allowed", b"/")
        return resp

    def redirect_to(route: str) -> Handler:
        async def handler(request: Request) -> Response:
            resp = Response(302, None, None)
            resp.add_header(b"Location", f"/#{route}".encode())
            return resp
        return handler

    app.router.add_get("/", index)
    app.router.add_get("/assets/*", asset)
    app.router.add_get("/manifest.webmanifest", manifest)
    app.router.add_get("/sw.js", worker)
    for route in ROUTES:
        app.router.add_get(f"/{route}", redirect_to(route))
    for path in open_paths():
        app.state.guard.open_route(path)


def open_paths() -> tuple[str, ...]:
    """The page's static shell: it holds nothing private, so it loads without the API key
    (the page then asks for the key and sends it on every API call)."""
    return ("/", "/assets/*", "/manifest.webmanifest", "/sw.js", *(f"/{r}" for r in ROUTES))


# -- opening the page on an interactive start ------------------------------------------
def page_url(host: str, port: int) -> str:
    """The web app's address as a browser on this machine reaches it."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def interactive_start(no_open: bool) -> bool:
    """Open a browser only for a person at a terminal: not with --no-open, not when
    output is piped or logged, not under tests or CI."""
    return not (no_open or current().process.no_open) and sys.stdout.isatty()


def open_when_started(server: uvicorn.Server, url: str, timeout: float = 60.0) -> threading.Thread:
    """Open ``url`` once ``server`` (a uvicorn.Server) listens."""
    def wait_and_open() -> None:
        deadline = time.monotonic() + timeout
        while not server.started and not server.should_exit and time.monotonic() < deadline:
            time.sleep(0.05)
        if server.started and not server.should_exit:
            webbrowser.open(url)

    thread = threading.Thread(target=wait_and_open, name="mlxbun-open-browser", daemon=True)
    thread.start()
    return thread
