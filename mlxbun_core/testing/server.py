"""A real mlxbun HTTP server on loopback, in a background thread, for tests.

Tests talk to it with the official SDKs over real HTTP; nothing of the engine is faked.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ..model import LoadOptions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    def __init__(self, engine, server, thread, port):
        self.engine, self.server, self.thread, self.port = engine, server, thread, port
        self.base_url = f"http://127.0.0.1:{port}"

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_server(model: str | Path | None = None, *, options: LoadOptions | None = None,
                 defaults: dict | None = None, max_tokens: int | None = None,
                 host: str = "127.0.0.1", api_key: str | None = None,
                 sessions_dir=None, limits=None, **engine_options) -> RunningServer:
    """Load ``model`` (path, repo id, .gguf or None for the default) and serve it on a free
    port. ``engine_options`` go to :class:`~mlxbun_core.engine.core.Engine` (``batch``,
    ``prompt_cache_bytes``); ``sessions_dir`` is where the web chat keeps sessions;
    ``limits`` (a ``ConnectionLimits``) replaces ``mlxbun serve``'s connection defaults."""
    import uvicorn

    from ..engine.core import Engine
    from ..server.app import build_app
    from ..server.connections import ConnectionLimits, uvicorn_settings
    from ..webapp.state import web_app_state

    engine = Engine.load(str(model) if model is not None else None, options or LoadOptions(),
                         progress=False, defaults=defaults, max_tokens=max_tokens,
                         **engine_options)
    port = free_port()
    app = build_app(engine, api_key=api_key, plugin_state=web_app_state(sessions_dir))
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            **uvicorn_settings(limits or ConnectionLimits(), app))  # as `serve`
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    return RunningServer(engine, server, thread, port)


@contextmanager
def running_server(model=None, **kw):
    srv = start_server(model, **kw)
    try:
        yield srv
    finally:
        srv.stop()
