"""A small real HTTP server that serves test media and records every request.

The SSRF tests point the fetcher at it and then check ``requests``: a refused URL
must leave it empty, an allowed one must show up with the right ``Host`` header.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Route = tuple | Callable[["MediaServer", BaseHTTPRequestHandler], tuple]


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class MediaServer:
    """Serve ``routes`` (path → ``(status, headers, body)`` or a callable returning one)
    on ``host``; every request lands in ``requests`` as ``(path, headers)``."""

    def __init__(self, host: str = "127.0.0.1", routes: dict | None = None):
        self.routes: dict[str, Route] = dict(routes or {})
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's naming
                outer.requests.append((self.path, dict(self.headers)))
                route = outer.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, headers, body = 404, {}, b"not found"
                elif callable(route):
                    status, headers, body = route(outer, self)
                else:
                    status, headers, body = route
                self.send_response(status)
                if "Content-Length" not in headers and not headers.get("_chunked"):
                    self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    if not k.startswith("_"):
                        self.send_header(k, v)
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_cls = type("S", (_Server,), {"address_family": family})
        self.httpd = server_cls((host, 0), Handler)
        self.host = host
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/", host: str | None = None) -> str:
        h = host or self.host
        if ":" in h:
            h = f"[{h}]"
        return f"http://{h}:{self.port}{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def slow(seconds: float, body: bytes = b"late"):
    """A route that answers after ``seconds``."""
    def route(server, handler):
        time.sleep(seconds)
        return 200, {}, body
    return route


def redirect(location: str, status: int = 302) -> tuple:
    return status, {"Location": location}, b""
