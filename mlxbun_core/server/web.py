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
from importlib import resources

from blacksheep import Request, Response
from blacksheep.contents import Content

from ..webchat.apptools import ROUTES
from . import guard
from .common import json_response

ASSET_CACHE = b"public, max-age=3600"
TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
         ".mjs": b"text/javascript; charset=utf-8", ".css": b"text/css; charset=utf-8",
         ".svg": b"image/svg+xml", ".webmanifest": b"application/manifest+json",
         ".txt": b"text/plain; charset=utf-8", ".json": b"application/json"}


def load_files() -> dict:
    """Every file of the web app, by URL path (``/assets/app.js``), as bytes."""
    root = resources.files("mlxbun_core") / "web"
    out = {}

    def walk(node, prefix):
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif not child.name.startswith("."):
                out[f"{prefix}{child.name}"] = child.read_bytes()

    walk(root, "/")
    return out


def shell_paths(files: dict) -> list:
    """What the service worker caches: the page and its assets, nothing dynamic."""
    return ["/"] + sorted(p for p in files if p.startswith("/assets/"))


def service_worker(files: dict) -> bytes:
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


def register(app, engine):
    files = load_files()
    sw = service_worker(files)

    async def index(request: Request):
        return _file(files["/index.html"], "/index.html", b"no-cache")

    async def asset(request: Request):
        path = request.path
        body = files.get(path)
        if body is None or not path.startswith("/assets/"):
            return json_response({"error": {"message": "not found", "type": "not_found_error"}}, 404)
        return _file(body, path, ASSET_CACHE)

    async def manifest(request: Request):
        return _file(files["/manifest.webmanifest"], "/manifest.webmanifest", ASSET_CACHE)

    async def worker(request: Request):
        resp = _file(sw, "/sw.js", b"no-store")
        resp.add_header(b"Service-Worker-Allowed", b"/")
        return resp

    def redirect_to(route: str):
        async def handler(request: Request):
            resp = Response(302, None, None)
            resp.add_header(b"Location", f"/#{route}".encode())
            return resp
        return handler

    app.router.add_get("/", index)
    app.router.add_get("/assets/*", asset)
    app.router.add_get("/manifest.webmanifest", manifest)
    app.router.add_get("/sw.js", worker)
    for path in ("/", "/assets/*", "/manifest.webmanifest", "/sw.js"):
        guard.open_route(app, path)
    for route in ROUTES:
        app.router.add_get(f"/{route}", redirect_to(route))
        guard.open_route(app, f"/{route}")
