"""The ``--isolate`` parent: owns TCP, answers CPU-only routes, proxies the rest.

It never runs a model and makes no MLX calls: it resolves which model to serve
from the local library, starts engine children (``mlxbun serve --unix``) through
the :class:`EnginePool`, and answers ``/health``, ``/engine``, ``/v1``,
``/v1/models``, ``/library``, ``/fit`` and the Responses store itself, so they
keep answering while an engine is down. Every other request is forwarded to
the engine its ``model`` field selects. ``/metrics`` merges its own series with every
ready engine's (:mod:`mlxbun_core.metrics.isolate`); a signal drains it
(:class:`~mlxbun_core.isolate.drain.ParentServer`: ``/health`` answers 503 ``draining``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import signal
import sys
import time
from pathlib import Path

from ..errors import APIError, Unavailable
from ..hub.jobs import downloading_provider
from ..library import checkpoint
from ..library.cache import LibraryCache, local_rows
from ..library.downloads import add_provider
from ..library.fit import Machine, machine
from ..library.listing import with_states
from ..library.report import fit_report, library_row
from ..metrics.isolate import ParentMetrics, route_of
from ..models.paths import mlxbun_home
from ..server.access_log import RecordingSend, log_answer
from ..server.body import JsonContentTypeError, check_content_type, parse_body
from ..server.origin import CorsRules
from . import access, hub_serve
from .child import MAX_RESTARTS, REFUSED, EngineUnavailable
from .drain import send_json
from .policy import PoolPolicy, route, routing_fields
from .pool import EnginePool, background
from .proxy import EngineGone, EngineRestarting, forward, send_unavailable
from .responses import ParentResponses

log = logging.getLogger("mlxbun.isolate")

MAX_BODY_BYTES = 256 << 20
ROUTED = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
          "/v1/embeddings", "/v1/rerank", "/v2/rerank", "/rerank", "/v1/messages/count_tokens",
          "/v1/audio/transcriptions"}
# route labels of what the parent answers itself (/metrics counts them)
LOCAL_ROUTES = ("/health", "/engine", "/v1", "/v1/models", "/v1/models/*", "/library", "/fit",
                "/metrics", "/v1/responses/*", "/ws/chat", "/admin/*", *sorted(ROUTED))
PROXIED = "mlxbun.proxied"  # set in the ASGI scope once an engine answered the request
NO_CHAT = ("The web chat needs a server started without --isolate (its sessions live with "
           "an in-process engine). The API and the Status page work here.")


class ParentApp:
    def __init__(self, pool: EnginePool, library: LibraryCache, api_key: str | None = None,
                 kv_bits: int | None = None, policy: PoolPolicy | None = None,
                 cors: CorsRules | None = None):
        self.pool, self.library = pool, library
        self.policy = policy or PoolPolicy()
        self.api_key = api_key
        self.rules = access.rules(api_key, cors)  # the serve guard's, on the forwarded path
        self.kv_bits = kv_bits  # the engines' --kv-quant, billed by /fit while they are down
        self.responses = ParentResponses()
        self.started_at = int(time.time())
        self._fit_weights: dict = {}
        self.metrics = ParentMetrics(pool)
        self.draining = False  # set by the first SIGINT/SIGTERM (ParentServer)
        self.exit_status = 0  # REFUSED once the default engine refused its first start
        # the children's downloads, from the shared job store: /v1/models says "downloading"
        add_provider(downloading_provider(mlxbun_home()))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] == "websocket":  # web chat needs a non-isolated server
            return await access.refuse_websocket(scope, send, self.rules, NO_CHAT)
        status, started = RecordingSend(send), time.perf_counter()
        try:
            await self._http(scope, receive, status)
        except BaseException:
            status.failed()
            raise
        finally:
            if not scope.get(PROXIED):  # an engine counts (and logs) what it answered itself
                self.metrics.count(route_of(scope["path"], LOCAL_ROUTES), scope["method"],
                                   status.code)
                log_answer(scope["method"], scope["path"], status.code, status.body, started)

    async def _http(self, scope, receive, send):
        key = access.prepare(scope)  # the path as forwarded, read as the engine's router reads it
        answer = access.check(scope, key, self.rules)
        if answer is not None:
            return await access.send_answer(send, scope, key, answer, self.rules)
        send = access.with_cors(send, scope, key, self.rules)
        method = scope["method"]
        local = self._local(key, method)
        if local is not None:
            return await local(scope, send)
        body = await self._body(receive)
        if isinstance(body, _Gone):
            return  # the client left while sending its body
        if body is None:
            return await send_json(send, 413, {"error": {
                "message": f"request body over {MAX_BODY_BYTES} bytes",
                "type": "invalid_request_error"}})
        # the pool is the parent's: it adds the model itself
        if key == "/api/hub/serve" and method == "POST" and (spec := await _pool_target(
                self.pool, self.library, scope, body)) is not None:
            return await send_json(send, 200, hub_serve.serve(self.pool, spec))
        await self._proxy(scope, key, body, receive, send)

    # ---------------------------------------------------------------- local routes
    def _local(self, key: str, method: str):
        """The parent's own handler for ``key`` (the route key), or None: proxy it."""
        if key.startswith("/admin/"):
            return lambda scope, send: send_json(send, 404, {"error": {"message": "not found"}})
        if key == "/ws/chat":
            return lambda scope, send: send_json(send, 501, {"error": {
                "message": NO_CHAT, "type": "not_implemented"}})
        if method not in ("GET", "HEAD", "DELETE"):
            return None
        if key.startswith("/v1/responses/") and method in ("GET", "DELETE"):
            return lambda scope, send: self.responses.answer(
                method, _tail(scope["path"], "/v1/responses/"), send)
        if method == "DELETE":
            return None
        return {"/health": self.health, "/engine": self.engine, "/v1": self.index,
                "/v1/models": self.models, "/library": self.get_library, "/fit": self.fit,
                "/metrics": self.get_metrics}.get(key) or (
                    self.model_by_id if key.startswith("/v1/models/") else None)

    async def health(self, scope, send):
        if self.draining:  # as the in-process server: load balancers stop sending
            return await send_json(send, 503, {"status": "draining"})
        first = self.pool.first
        if first is None or not first.was_ready:  # the default engine has not answered yet
            state = first.state if first is not None else "new"
            if state != "failed":
                return await send_json(send, 503, {"status": "loading"})
            return await send_json(send, 503, {"status": "unavailable", "reason":
                                               f"engine {first.model_id} failed to start"})
        d = self.pool.default_engine()
        problem = await d.problem() if d is not None else None
        if problem is not None:  # the engine's device failed: it restarts, or cannot
            return await send_json(send, 503, {"status": problem[0], "reason": problem[1]})
        await send_json(send, 200, {"status": "ok"})

    async def get_metrics(self, scope, send):
        content_type, body = await self.metrics.render()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def begin_drain(self) -> None:
        """The first signal: refuse new generation, answer /health 503, keep engines down."""
        self.draining = True
        self.pool.stop_respawning()

    @property
    def busy(self) -> int:
        """Requests being proxied to an engine now (what a drain waits for)."""
        return sum(e.in_flight for e in list(self.pool.engines.values()))

    async def engine(self, scope, send):
        d = self.pool.default_engine()
        desc = d.describe() if d else {}
        await send_json(send, 200, {
            "isolated": True, "pid": desc.get("pid"), "restarts": desc.get("restarts"),
            "socket": desc.get("socket"), "state": desc.get("state", "evicted"),
            "response_store": self.responses.store.stats(), "pool": self.pool.describe()})

    async def index(self, scope, send):
        from ..server.meta import ENDPOINTS

        await send_json(send, 200, {"name": "mlxbun", "version": _version(),
                                    "model": self.served_id(), "isolated": True,
                                    "endpoints": ENDPOINTS + ["GET /engine"],
                                    "web_chat": {"available": False, "reason": NO_CHAT}})

    def served_id(self) -> str:
        d = self.pool.default_engine()
        return d.model_id if d else self.pool.default.id

    def served_row(self) -> dict:
        d = self.pool.default_engine()
        if d is not None and d.served_row:
            return {**d.served_row, "created": self.started_at}
        return {"id": self.served_id(), "object": "model", "created": self.started_at,
                "owned_by": "mlxbun"}

    async def _rows(self) -> list:
        """The default model, the local library, downloads and aliases: each with its
        state in the pool, only what the allow-list admits."""
        entries = await self.library.aentries()
        rows = [self.served_row()] + local_rows(entries, self.served_id(), self.started_at)
        return with_states(rows, self.policy.aliases, self.started_at,
                           describe=self.pool.model_state, allowed=self._servable,
                           expected=sorted(self.policy.allowed or ()))

    def _servable(self, name: str) -> bool:
        """The default model, a pinned one, or one the allow-list (if any) admits."""
        return name in (self.pool.default.id, self.served_id()) or self.pool.pinned(name) \
            or self.policy.allows(name)

    async def models(self, scope, send):
        await send_json(send, 200, {"object": "list", "data": await self._rows()})

    async def model_by_id(self, scope, send):
        wanted = _tail(scope["path"], "/v1/models/")
        row = next((r for r in await self._rows() if r["id"] == wanted), None)
        if row is None:  # as server/meta.py answers it
            return await send_json(send, 404, {"error": {
                "message": f"The model {wanted!r} does not exist (GET /v1/models lists them)",
                "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})
        await send_json(send, 200, row)

    def machine(self) -> Machine:
        """The engines' view of the machine (MLX's numbers); system RAM until one reports."""
        for e in self.pool.engines.values():
            if e.machine:
                m = e.machine
                return Machine(m["device"], m["chip"], m["ram_bytes"], m["usable_bytes"],
                               m["bandwidth_gbs"], m["bandwidth_source"])
        return machine(probe_mlx=False)

    async def get_library(self, scope, send):
        refresh = b"refresh=1" in scope.get("query_string", b"")
        entries = await self.library.aentries(refresh)
        m = await asyncio.to_thread(self.machine)
        await send_json(send, 200, {"models": [library_row(e, m, self.served_id())
                                               for e in entries]})

    async def fit(self, scope, send):
        """The engine's own /fit (its admission's numbers) while it is up; while it is
        down, the same plan from the checkpoint's headers and the machine it reported."""
        d, path = self.pool.default_engine(), self._served_path()
        if path is None or (d is not None and d.state == "ready"):
            return await self._proxy(scope, "/fit", b"", None, send)
        ctx = _ctx(scope.get("query_string", b""))
        if ctx == -1:
            return await send_json(send, 400, {"error": {
                "message": "ctx must be a positive integer", "type": "invalid_request_error",
                "param": "ctx"}})
        if path not in self._fit_weights:
            self._fit_weights[path] = await asyncio.to_thread(checkpoint.weights, path)
        config = checkpoint.read_json(path / "config.json")
        m = await asyncio.to_thread(self.machine)
        await send_json(send, 200, fit_report(config, self._fit_weights[path], m, context=ctx,
                                              kv_bits=self.kv_bits))

    def _served_path(self) -> Path | None:
        arg = self.pool.default.arg
        if arg and (Path(arg) / "config.json").is_file():
            return Path(arg)
        entry = self.library.find(self.served_id())
        return entry.path if entry else None

    # ---------------------------------------------------------------- proxying
    async def _body(self, receive) -> bytes | _Gone | None:
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return _GONE
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_BODY_BYTES:
                return None
            if not msg.get("more_body"):
                return b"".join(chunks)

    async def _proxy(self, scope, key: str, body: bytes, receive, send):
        path, method = key, scope["method"]
        spec, turn, keep_alive = self.pool.default, None, None
        if method == "POST" and path in ROUTED:
            if self.draining:
                return await send_json(send, 503, _shaped(Unavailable().body(), path))
            if self.pool.cap > 1 or self.policy.allowed is not None:
                await self.library.aentries()  # any rescan happens off the event loop
            routing = routing_fields(body, self.policy,
                                     dict(scope["headers"]).get(b"content-type"))
            spec, refused = route(path, routing, self.pool, self.policy, self._servable)
            if refused is not None:
                return await send_json(send, *refused)
            keep_alive = routing.keep_alive
            if path == "/v1/responses":
                body, turn, error = self.responses.prepare(body)
                if error is not None:
                    return await send_json(send, 404, error)
        receive = receive or _never_disconnects
        retry = method in ("GET", "HEAD") and not body  # bodyless reads retry once
        restarts = MAX_RESTARTS  # a request the engine's device fault left unrun waits
        while True:
            engine = None
            try:
                async with self.pool.lease(spec, keep_alive) as engine:
                    scope[PROXIED] = True  # from here on the engine answers (and counts)
                    await forward(engine, scope, body, receive, send,
                                  turn.observer if turn else None)
                return
            except EngineRestarting as exc:
                scope[PROXIED] = False
                if engine is not None:
                    engine.restarting(exc.pid)
                if restarts <= 0 or self.draining:
                    return await exc.send(send)
                restarts -= 1
                log.info("engine restarting after a device fault: %s %s waits for it",
                         method, path)
            except EngineUnavailable as exc:
                scope[PROXIED] = False
                return await send_unavailable(send, str(exc))
            except EngineGone as exc:
                scope[PROXIED] = False
                if not retry:
                    return await send_unavailable(send, str(exc))
                retry = False
                log.info("retrying %s %s once the engine is back", method, path)

    async def _exit_if_refused(self) -> None:
        """The default engine refused its first start (a model that does not exist, a bad
        flag: it said why on stderr): the parent stops too, with the same status, instead
        of serving 503s."""
        if await self.pool.first_refused():
            print("mlxbun: the default engine refused to start (see above); exiting",
                  file=sys.stderr, flush=True)
            self.exit_status = REFUSED
            os.kill(os.getpid(), signal.SIGTERM)  # the usual drain, then the exit

    # ---------------------------------------------------------------- lifespan
    async def _lifespan(self, receive, send):
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await self.pool.start()
                background(asyncio.to_thread(self.library.entries))  # warm the scan
                background(self._exit_if_refused())
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


class _Gone(enum.Enum):
    GONE = "gone"  # the client left while sending its body


_GONE = _Gone.GONE


def _shaped(body: dict, path: str) -> dict:
    """An OpenAI-shaped error body in the Anthropic shape for /v1/messages."""
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": body["error"]}
    return body


async def _never_disconnects():
    await asyncio.Event().wait()


async def _pool_target(pool: EnginePool, library: LibraryCache, scope, body: bytes):
    try:
        check_content_type(dict(scope["headers"]).get(b"content-type"), len(body))
        parsed = parse_body(body)
    except (APIError, JsonContentTypeError):
        return None  # the engine's own parser answers the 400 (415)
    return await hub_serve.wanted_fresh(pool, library, parsed)


def _tail(path: str, prefix: str) -> str:
    """What follows ``prefix`` in ``path`` (matched in any letter case, as the router
    does), its own letters kept: an id."""
    return path[len(prefix):]


def _ctx(query: bytes) -> int | None:
    for part in query.decode("latin-1").split("&"):
        if part.startswith("ctx="):
            try:
                v = int(part[4:])
            except ValueError:
                return -1
            return v if v > 0 else -1
    return None


def _version() -> str:
    from .. import __version__

    return __version__
