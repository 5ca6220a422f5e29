"""Resident engine children, one per model, least recently used drained past the cap.

A request whose ``model`` is an exact ``/v1/models`` id goes to that model's engine
(spawned on demand while the others keep serving); anything else rides the
default engine. Cold starts are serialized (one model loads at a time); once the
newcomer is ready the least recently used idle engine is drained. An engine with
requests in flight is never the one evicted, so a fresh engine keeps its pending
request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass

from .child import EngineProcess

log = logging.getLogger("mlxbun.isolate")

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
                 api_key: str | None = None):
        self.default = default
        self.api_key = api_key
        self.engine_argv = engine_argv
        self.cap = max(1, int(cap))
        self.lookup = lookup  # exact /v1/models id -> how to start it (None: not a local model)
        self.engines: OrderedDict[str, EngineProcess] = OrderedDict()  # LRU first
        self.evictions = 0
        self.demotions = 0  # prompt-cache entries evicted engines demoted to the SSD tier
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
    async def lease(self, spec: ModelSpec):
        """The ready engine for ``spec``, counted in flight while the block runs."""
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
            await self._enforce_cap()

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
        self.engines[spec.id] = engine
        return engine

    async def _enforce_cap(self):
        while len(self.engines) > self.cap and not self._closing:
            idle = [k for k, e in self.engines.items() if e.in_flight == 0]
            if not idle:
                return  # every engine is busy: try again when a request ends
            victim = idle[0]  # least recently used among the idle
            engine = self.engines.pop(victim)
            self.evictions += 1
            log.info("pool: draining %s (least recently used; cap %d)", victim, self.cap)
            await engine.stop(drain=True)
            self.demotions += engine.demotions

    # ---------------------------------------------------------------- life
    async def start(self):
        """Start the default engine; requests wait for its readiness, start-up does not."""
        await self._new(self.default).start()

    def stop_respawning(self) -> None:
        """The parent is draining: engines that exit from now on stay down."""
        self._respawn = False
        for engine in list(self.engines.values()):
            engine.respawn = False

    async def close(self):
        self._closing = True
        engines = list(self.engines.values())
        self.engines.clear()
        # drained, so an engine with an SSD tier writes its prompt cache before it goes
        await asyncio.gather(*(e.stop(drain=True) for e in engines), return_exceptions=True)

    def default_engine(self) -> EngineProcess | None:
        return self.engines.get(self.default.id)

    def describe(self) -> dict:
        return {"cap": self.cap, "default": self.default.id, "evictions": self.evictions,
                "demotions": self.demotions,
                "resident": [e.describe() for e in self.engines.values()]}
