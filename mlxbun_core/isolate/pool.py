"""Resident engine children, one per model, least recently used drained past the cap.

A request whose ``model`` is an exact ``/v1/models`` id goes to that model's engine
(spawned on demand while the others keep serving); anything else rides the
default engine. Cold starts are serialized (one model loads at a time); once the
newcomer is ready the least recently used idle engine is drained. An engine with
requests in flight is never the one evicted, so a fresh engine keeps its pending
request.

Managed (``--pin``, ``--keep-alive``, a request's ``keep_alive``): pinned models start
with the pool and are never drained; any other engine idle past its keep-alive (set
by the last request it answered: that request's ``keep_alive``, else the model's
``mlxbun.yaml`` entry, else ``--keep-alive``; forever by default) is drained by the
reaper, and ``keep_alive: 0`` drains it as soon as its reply is done.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass

from .child import EngineProcess

log = logging.getLogger("mlxbun.isolate")

REAP_INTERVAL_S = 0.25  # how often idle engines are checked against their keep-alive

# the event loop keeps only weak references to tasks: a fire-and-forget task is held here
# until it finishes, or it could be garbage-collected half way
_background: set[asyncio.Task] = set()


def background(coro: Coroutine[object, object, object]) -> asyncio.Task:
    """Run ``coro`` as a task nobody awaits, kept alive until it is done."""
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


@dataclass(frozen=True)
class ModelSpec:
    id: str
    arg: str | None  # what --model pins on the child (a directory, a name, None)


class EnginePool:
    def __init__(self, default: ModelSpec, engine_argv: list[str], cap: int = 1,
                 lookup: Callable[[str], ModelSpec | None] = lambda _id: None,
                 api_key: str | None = None, pins: tuple[ModelSpec, ...] = (),
                 keep_alive: float = math.inf,
                 model_keep_alive: Callable[[str], float | None] = lambda _id: None):
        self.default = default
        self.api_key = api_key
        self.first: EngineProcess | None = None  # the default engine as first started
        self.engine_argv = engine_argv
        self.cap = max(1, int(cap))
        self.lookup = lookup  # exact /v1/models id -> how to start it (None: not a local model)
        self.engines: OrderedDict[str, EngineProcess] = OrderedDict()  # LRU first
        self.evictions = 0
        self.demotions = 0  # prompt-cache entries evicted engines demoted to the SSD tier
        self.pins = {spec.id: spec for spec in pins}  # started with the pool, never drained
        self.keep_alive = keep_alive  # seconds an idle engine stays (math.inf: forever)
        self.model_keep_alive = model_keep_alive  # a model's own default (None: the pool's)
        self.unloads = 0  # engines drained for being idle past their keep-alive
        self._reaper: asyncio.Task | None = None
        self._cold = asyncio.Lock()
        self._closing = False
        self._respawn = True

    # ---------------------------------------------------------------- routing
    def target(self, model_field) -> ModelSpec:
        """The engine a request's ``model`` field selects (exact ids only)."""
        if isinstance(model_field, str) and model_field:
            d = self.default_engine()
            if model_field == self.default.id or (d is not None and model_field == d.model_id):
                return self.default
            if self.cap > 1 and model_field in self.engines:
                return ModelSpec(model_field, self.engines[model_field].model_arg)
            if self.cap > 1:
                spec = self.lookup(model_field)
                if spec is not None:
                    return spec
        return self.default

    @asynccontextmanager
    async def lease(self, spec: ModelSpec, keep_alive: float | None = None):
        """The ready engine for ``spec``, counted in flight while the block runs; it then
        stays loaded ``keep_alive`` seconds (None: the model's or the pool's default)."""
        engine = self.engines.get(spec.id)
        if engine is None or engine.state in ("stopping", "stopped"):
            engine = await self._cold_start(spec)  # counted in flight already
        else:
            engine.in_flight += 1
        self._touch(spec.id)
        try:
            await engine.wait_ready()
            if len(self.engines) > self.cap:  # the newcomer is ready: drain the LRU now
                background(self._enforce_cap())
            yield engine
        finally:
            engine.in_flight -= 1
            engine.last_used = time.monotonic()
            engine.keep_alive = self._keep_alive_for(spec.id, keep_alive)
            await self._enforce_cap()
            if engine.keep_alive == 0:
                background(self._reap())

    def _keep_alive_for(self, model_id: str, asked: float | None) -> float:
        if asked is not None:
            return asked
        own = self.model_keep_alive(model_id)
        return self.keep_alive if own is None else own

    def pinned(self, key: str) -> bool:
        return key in self.pins

    def _touch(self, key: str):
        if key in self.engines:
            self.engines.move_to_end(key)

    async def _cold_start(self, spec: ModelSpec) -> EngineProcess:
        async with self._cold:
            engine = self.engines.get(spec.id)
            if engine is not None and engine.state not in ("stopping", "stopped"):
                engine.in_flight += 1
                return engine
            engine = self._new(spec)
            engine.in_flight += 1  # before any await: a cap check must never pick it
            try:  # one model loads at a time; the resident ones keep serving meanwhile
                await engine.start()
                await engine.wait_ready()
            except BaseException:
                engine.in_flight -= 1
                raise
            return engine

    def _new(self, spec: ModelSpec) -> EngineProcess:
        engine = EngineProcess(spec.id, spec.arg, self.engine_argv, api_key=self.api_key)
        engine.respawn = self._respawn
        engine.keep_alive = self._keep_alive_for(spec.id, None)  # until a request says
        self.engines[spec.id] = engine
        return engine

    async def _enforce_cap(self):
        while len(self.engines) > self.cap and not self._closing:
            idle = [k for k, e in self.engines.items() if e.in_flight == 0 and k not in self.pins]
            if not idle:
                return  # every engine is busy or pinned: try again when a request ends
            victim = idle[0]  # least recently used among the idle
            engine = self.engines.pop(victim)
            self.evictions += 1
            log.info("pool: draining %s (least recently used; cap %d)", victim, self.cap)
            await engine.stop(drain=True)
            self.demotions += engine.demotions

    async def _reap(self) -> None:
        """Drain the idle, unpinned engines whose keep-alive has run out."""
        now = time.monotonic()
        for key, engine in list(self.engines.items()):
            if (engine.in_flight == 0 and key not in self.pins and not self._closing
                    and now - engine.last_used >= engine.keep_alive
                    and engine.state not in ("new", "starting", "dead")
                    and self.engines.get(key) is engine):
                del self.engines[key]
                self.unloads += 1
                log.info("pool: unloading %s (idle past its keep_alive of %s)", key,
                         "0 s" if engine.keep_alive == 0 else f"{engine.keep_alive:g} s")
                await engine.stop(drain=True)
                self.demotions += engine.demotions

    async def _reap_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(REAP_INTERVAL_S)
            try:
                await self._reap()
            except Exception:  # the reaper must outlive any one engine's failure to stop
                log.exception("pool: reaper")

    async def _preload(self, spec: ModelSpec) -> None:
        try:
            engine = await self._cold_start(spec)
        except Exception:
            log.exception("pool: pinned model %s did not start", spec.id)
            return
        engine.in_flight -= 1

    # ---------------------------------------------------------------- life
    async def start(self):
        """Start the default engine, then the pinned ones in the background (one load at
        a time); requests wait for readiness, start-up does not."""
        self.first = self._new(self.default)
        await self.first.start()
        for spec in self.pins.values():
            if spec.id != self.default.id:
                background(self._preload(spec))
        self._reaper = background(self._reap_forever())  # any request may ask for a TTL

    async def first_refused(self) -> bool:
        """Whether the default engine refused its first start (waits for the outcome)."""
        engine = self.first
        assert engine is not None  # start() made it
        while engine.state not in ("ready", "failed", "stopping", "stopped"):
            await asyncio.sleep(0.1)
        return engine.refused

    def stop_respawning(self) -> None:
        """The parent is draining: engines that exit from now on stay down."""
        self._respawn = False
        for engine in list(self.engines.values()):
            engine.respawn = False

    async def close(self):
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
        engines = list(self.engines.values())
        self.engines.clear()
        # drained, so an engine with an SSD tier writes its prompt cache before it goes
        await asyncio.gather(*(e.stop(drain=True) for e in engines), return_exceptions=True)

    def default_engine(self) -> EngineProcess | None:
        return self.engines.get(self.default.id)

    def engine_for(self, model_id: str) -> EngineProcess | None:
        """The engine serving ``model_id`` (by its pool key or the id it reported)."""
        engine = self.engines.get(model_id)
        if engine is not None:
            return engine
        return next((e for e in self.engines.values() if e.model_id == model_id), None)

    def model_state(self, model_id: str) -> dict:
        """``/v1/models``'s live fields of one model: state, pinned, when it unloads."""
        engine = self.engine_for(model_id)
        pinned = model_id in self.pins or (engine is not None and engine.model_id in self.pins)
        if engine is None:
            return {"state": "on_disk", "pinned": pinned}
        state = {"ready": "resident", "stopping": "unloading", "failed": "failed",
                 "stopped": "on_disk"}.get(engine.state, "loading")
        out = {"state": state, "pinned": pinned}
        left = None if pinned or engine.in_flight else engine.keep_alive - (
            time.monotonic() - engine.last_used)
        if state == "resident" and left is not None and left != math.inf:
            out["expires_at"] = int(time.time() + max(0.0, left))
        return out

    def describe(self) -> dict:
        return {"cap": self.cap, "default": self.default.id, "evictions": self.evictions,
                "demotions": self.demotions, "unloads": self.unloads,
                "pins": sorted(self.pins),
                "keep_alive": None if self.keep_alive == math.inf else self.keep_alive,
                "resident": [{**e.describe(), "pinned": k in self.pins,
                              "keep_alive": None if e.keep_alive == math.inf else e.keep_alive}
                             for k, e in self.engines.items()]}
