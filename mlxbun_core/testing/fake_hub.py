"""A local stand-in for the Hugging Face Hub's HTTP API, on loopback, for tests.

The hub is the one boundary tests may fake. This is a real HTTP server that speaks
enough of the hub's API for ``huggingface_hub`` itself to search, download (HEAD then
ranged GETs, so resume works) and push (create repo, preupload, commit with regular
base64 files); point ``HF_ENDPOINT`` at :attr:`FakeHub.url`. Gated repos answer 401
without a token it knows; unknown repos answer 404 with the hub's error-code headers,
so the client raises the same exceptions it raises against the real hub.

Switches for failure tests: ``throttle_s`` (sleep per 64 KiB chunk of a file body, to
cancel a download midway) and ``cut_after`` (close the connection after that many bytes
of every file body: an interrupted transfer). Every request lands in ``requests``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .helpers import environ

CHUNK = 64 << 10
_REPO = r"(?P<repo>[^/]+/[^/]+)"
_API = re.compile(rf"^/api/(?P<kind>models|datasets)/{_REPO}(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(rf"^/api/(?P<kind>models|datasets)/{_REPO}/tree/(?P<rev>[^/]+)(?P<sub>/.*)?$")
_RESOLVE = re.compile(rf"^(?P<prefix>/datasets)?/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_PREUPLOAD = re.compile(rf"^/api/(?P<kind>models|datasets)/{_REPO}/preupload/(?P<rev>[^/]+)$")
_COMMIT = re.compile(rf"^/api/(?P<kind>models|datasets)/{_REPO}/commit/(?P<rev>[^/]+)$")


@dataclass
class FakeRepo:
    """One repo: its files at one commit, and how the hub presents it."""

    files: dict[str, bytes]
    kind: str = "model"  # or "dataset"
    gated: bool = False
    private: bool = False
    tags: list[str] = field(default_factory=lambda: ["mlx", "safetensors"])
    downloads: int = 0
    likes: int = 0

    @property
    def sha(self) -> str:
        h = hashlib.sha1()
        for path in sorted(self.files):
            h.update(path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return h.hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class FakeHub:
    """Serve ``repos`` (repo id -> :class:`FakeRepo`) on 127.0.0.1. ``tokens``: the tokens
    it accepts (for gated repos and pushes)."""

    def __init__(self, repos: dict[str, FakeRepo] | None = None, tokens: tuple[str, ...] = ()):
        self.repos: dict[str, FakeRepo] = dict(repos or {})
        self.tokens = set(tokens)
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        self.throttle_s = 0.0
        self.cut_after: int | None = None
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # http.server's naming
                hub.dispatch(self, "GET")

            def do_HEAD(self) -> None:
                hub.dispatch(self, "HEAD")

            def do_POST(self) -> None:
                hub.dispatch(self, "POST")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ranges(self) -> list[str]:
        """The Range headers file GETs carried (a resumed download sends ``bytes=N-``)."""
        return [h.get("Range", "") for m, p, h in self.requests
                if m == "GET" and "/resolve/" in p and h.get("Range")]

    # -- routing ------------------------------------------------------------------
    def dispatch(self, rq: BaseHTTPRequestHandler, method: str) -> None:
        """Answer one request its handler (the server's thread) was handed."""
        url = urlsplit(rq.path)
        path, query = unquote(url.path), parse_qs(url.query)
        with self.lock:
            self.requests.append((method, rq.path, dict(rq.headers)))
        body = b""
        if method == "POST":
            body = rq.rfile.read(int(rq.headers.get("Content-Length") or 0))
        try:
            if method in ("GET", "HEAD") and (m := _RESOLVE.match(path)):
                return self._resolve(rq, method, m)
            if method == "GET" and path == "/api/models":
                return self._json(rq, self._search(query))
            if method == "GET" and (m := _TREE.match(path)):
                repo = self._repo(rq, m["repo"], m["kind"])
                return self._json(rq, [self._tree_row(p, d) for p, d in sorted(repo.files.items())])
            if method == "GET" and (m := _API.match(path)):
                return self._json(rq, self._info(self._repo(rq, m["repo"], m["kind"]), m["repo"]))
            if method == "GET" and path == "/api/whoami-v2":
                self._auth(rq)
                return self._json(rq, {"type": "user", "name": "tester", "auth": {
                    "accessToken": {"role": "write"}}})
            if method == "POST" and path == "/api/validate-yaml":  # a card's metadata
                return self._json(rq, {"errors": [], "warnings": []})
            if method == "POST" and path == "/api/repos/create":
                return self._create(rq, json.loads(body or b"{}"))
            if method == "POST" and (m := _PREUPLOAD.match(path)):
                self._auth(rq)
                files = json.loads(body or b"{}").get("files", [])
                return self._json(rq, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                  "shouldIgnore": False} for f in files]})
            if method == "POST" and (m := _COMMIT.match(path)):
                return self._commit(rq, m, body)
            raise _HubError(404, "EntryNotFound", f"no route {path}")
        except _HubError as exc:
            self._send(rq, exc.status, {"X-Error-Code": exc.code, "X-Error-Message": exc.message},
                       json.dumps({"error": exc.message}).encode(), method != "HEAD")

    def _auth(self, rq: BaseHTTPRequestHandler) -> str:
        got = (rq.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if got not in self.tokens:
            raise _HubError(401, "", "Invalid credentials in Authorization header")
        return got

    def _repo(self, rq: BaseHTTPRequestHandler, repo_id: str, kind: str = "models") -> FakeRepo:
        repo = self.repos.get(repo_id)
        if repo is None or repo.kind + "s" != kind:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        if repo.gated or repo.private:
            try:
                self._auth(rq)
            except _HubError:
                if repo.gated:
                    raise _HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. "
                                    "You must have access to it and be authenticated.") from None
                raise _HubError(404, "RepoNotFound", "Repository not found") from None
        return repo

    # -- read ---------------------------------------------------------------------
    def _search(self, query: dict) -> list[dict]:
        q = (query.get("search") or [""])[0].lower()
        wanted = query.get("filter") or []
        rows: list[dict[str, Any]] = [
            {"id": rid, "modelId": rid, "downloads": r.downloads, "likes": r.likes,
             "tags": r.tags, "private": r.private, "gated": r.gated}
                for rid, r in sorted(self.repos.items()) if r.kind == "model" and not r.private
                and q in rid.lower() and all(t in r.tags for t in wanted)]
        rows.sort(key=lambda row: -row["downloads"])
        limit = int((query.get("limit") or ["1000"])[0])
        return rows[:limit]

    @staticmethod
    def _tree_row(path: str, data: bytes) -> dict:
        return {"type": "file", "path": path, "size": len(data), "oid": _git_oid(data)}

    def _info(self, repo: FakeRepo, repo_id: str) -> dict:
        return {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": repo.private,
                "gated": "auto" if repo.gated else False, "tags": repo.tags,
                "downloads": repo.downloads, "likes": repo.likes,
                "siblings": [{"rfilename": p, "size": len(d), "blobId": _git_oid(d)}
                             for p, d in sorted(repo.files.items())]}

    def _resolve(self, rq: BaseHTTPRequestHandler, method: str, m: re.Match) -> None:
        kind = "datasets" if m["prefix"] else "models"
        repo = self._repo(rq, m["repo"], kind)
        data = repo.files.get(m["path"])
        if data is None:
            raise _HubError(404, "EntryNotFound", f"{m['path']} not found")
        etag = hashlib.sha256(data).hexdigest()
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        start, status = 0, 200
        rng = re.match(r"bytes=(\d+)-$", rq.headers.get("Range") or "")
        if rng and method == "GET":
            start, status = min(int(rng[1]), len(data)), 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return self._send(rq, 200, headers, b"", False)
        headers["Content-Length"] = str(len(body))
        rq.send_response(status)
        for k, v in headers.items():
            rq.send_header(k, v)
        rq.end_headers()
        sent = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for i in range(0, len(body), CHUNK):
                piece = body[i:i + CHUNK]
                if self.cut_after is not None and sent + len(piece) > self.cut_after:
                    rq.wfile.write(piece[: max(0, self.cut_after - sent)])
                    rq.wfile.flush()
                    rq.close_connection = True
                    with contextlib.suppress(OSError):
                        rq.connection.shutdown(2)
                    return
                rq.wfile.write(piece)
                rq.wfile.flush()
                sent += len(piece)
                if self.throttle_s:
                    time.sleep(self.throttle_s)

    # -- write --------------------------------------------------------------------
    def _create(self, rq: BaseHTTPRequestHandler, body: dict) -> None:
        self._auth(rq)
        name = body.get("name", "")
        repo_id = f"{body['organization']}/{name}" if body.get("organization") else name
        if "/" not in repo_id:
            repo_id = f"tester/{repo_id}"
        kind = body.get("type") or "model"
        prefix = "" if kind == "model" else f"/{kind}s"
        if repo_id in self.repos:
            raise _HubError(409, "", "You already created this repo")
        self.repos[repo_id] = FakeRepo({}, kind=kind, private=bool(body.get("private")), tags=[])
        self._json(rq, {"url": f"{self.url}{prefix}/{repo_id}", "name": repo_id})

    def _commit(self, rq: BaseHTTPRequestHandler, m: re.Match, body: bytes) -> None:
        self._auth(rq)
        repo = self.repos.get(m["repo"])
        if repo is None or repo.kind + "s" != m["kind"]:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        for line in body.splitlines():
            item = json.loads(line)
            if item.get("key") == "file":
                value = item["value"]
                repo.files[value["path"]] = base64.b64decode(value["content"])
            elif item.get("key") == "lfsFile":
                raise _HubError(400, "", "this fake hub takes regular files only")
        prefix = "" if repo.kind == "model" else f"/{repo.kind}s"
        self._json(rq, {"commitUrl": f"{self.url}{prefix}/{m['repo']}/commit/{repo.sha}",
                        "commitOid": repo.sha})

    # -- replies ------------------------------------------------------------------
    def _json(self, rq: BaseHTTPRequestHandler, data: object) -> None:
        self._send(rq, 200, {"Content-Type": "application/json"}, json.dumps(data).encode(), True)

    @staticmethod
    def _send(rq: BaseHTTPRequestHandler, status: int, headers: dict, body: bytes,
              with_body: bool) -> None:
        rq.send_response(status)
        headers = {k: v for k, v in headers.items() if v}
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            rq.send_header(k, v)
        rq.end_headers()
        if with_body:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                rq.wfile.write(body)


class _HubError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def repo_from_dir(path: Path, *, gated: bool = False, downloads: int = 0,
                  tags: list[str] | None = None) -> FakeRepo:
    """A :class:`FakeRepo` holding every file under a checkpoint directory."""
    files = {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*"))
             if p.is_file()}
    return FakeRepo(files, gated=gated, downloads=downloads,
                    tags=["mlx", "safetensors"] if tags is None else tags)


HUB_ENV = ("HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN",
           "HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_DISABLE_TELEMETRY")


@contextlib.contextmanager
def hub_environment(root: Path, hub: FakeHub) -> Iterator[Path]:
    """Point every HF setting of this process (and the job subprocesses it starts) at
    ``root`` and ``hub``: cache and token under ``root/hf``, online, no token; restore
    the environment afterwards. Yields the hub cache directory."""
    with environ(unset=HUB_ENV, HF_HOME=str(root / "hf"), HF_HUB_CACHE=str(root / "hf" / "hub"),
                 HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1"):
        yield root / "hf" / "hub"


def padding_safetensors(n: int) -> bytes:
    """A valid safetensors file of one ``n``-byte U8 tensor: a big file to download."""
    header = json.dumps({"pad": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + (bytes(range(256)) * (n // 256 + 1))[:n]


@contextlib.contextmanager
def silent_hub() -> Iterator[str]:
    """A hub that accepts every connection and never answers (a stuck proxy, a captive
    portal, a hung server); yields its URL for ``HF_ENDPOINT``. Connections stay open
    until the block ends."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        for conn in held:
            conn.close()
        thread.join(timeout=5)
