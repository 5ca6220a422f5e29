"""In-process engine helpers: run request bodies straight on an :class:`Engine` (no HTTP),
render chat bodies to the prompt a request would run, and compare what lanes produce,
token for token."""

from __future__ import annotations

import asyncio
import functools
import threading

from ..engine.core import Engine
from ..engine.lanes.pace import FixedChunk, PrefillPacer
from ..engine.prepare import Prepared, prepare
from ..engine.reply import gather
from ..engine.session import GenerationRequest
from ..events import Done


def prepare_chat(engine: Engine, body: dict) -> Prepared:
    """Parse and render a chat body synchronously, through the same hooks as a request."""
    return prepare(engine.model, engine.hooks, engine.parse_chat(body))


def rendered_chat(engine: Engine, body: dict) -> tuple[str, GenerationRequest]:
    """The prompt text a chat body renders to (specials included), and its request."""
    req = prepare_chat(engine, body).request
    return engine.model.tokenizer.decode(req.prompt_tokens), req


def run_all(engine: Engine, bodies: list, together: bool = False) -> list:
    """Start every completion body at once on ``engine``; the gathered replies
    (``together``: as for :func:`finishes`)."""
    async def collect(gen):
        return gather([ev async for ev in gen.events()])

    async def go():
        return await asyncio.gather(*[collect(g) for g in await _started(
            engine, bodies, together)])

    return asyncio.run(go())


async def _started(engine: Engine, bodies: list, together: bool) -> list:
    """Each body's started generation; ``together``: the worker takes no step before
    every body is queued, so which rows share the first steps does not depend on this
    machine's speed."""
    gate = threading.Event()
    if together:
        engine.worker.post(lambda: gate.wait(30))
    try:
        return [await engine.start(engine.parse_completion(b)) for b in bodies]
    finally:
        gate.set()


def finishes(engine: Engine, bodies: list[dict], together: bool = False) -> list:
    """Every body's ``Finish``, failed ones included (``together``: the worker takes no
    step before every body is queued)."""
    async def events(gen) -> list:
        return [ev async for ev in gen.events()]

    async def go():
        return await asyncio.gather(*[events(g) for g in await _started(
            engine, bodies, together)])

    done = asyncio.run(go())
    return [next(ev.finish for ev in evs if isinstance(ev, Done)) for evs in done]


def token_ids(reply) -> list:
    """The sampled token ids of a reply started with ``"logprobs": True``."""
    return [e["id"] for e in reply.finish.logprobs]


def engines(path, **kw) -> tuple[Engine, Engine]:
    """The same checkpoint loaded twice: batched (``batch=8``) and serial (``batch=1``),
    prefix cache off so both compute every token."""
    batched = Engine.load(str(path), progress=False, batch=8, prompt_cache_bytes=0, **kw)
    serial = Engine.load(str(path), progress=False, batch=1, prompt_cache_bytes=0, **kw)
    return batched, serial


def settled(engine: Engine) -> None:
    """Wait for the worker to end the step that answered the last request: a lane stores
    a finished request's KV in the prefix cache after its client has the answer, so a
    test that reads or resets the cache right after a response waits for this first."""
    engine.worker.run_sync(lambda: None, timeout=60)


def close(*engs: Engine) -> None:
    """Close ``engs``, checking first that the batch's block pool holds nothing but the
    prefix cache's entries (no row's blocks leaked)."""
    for e in engs:
        leaked = 0
        if e.worker.running:  # (a test may have closed it already)
            leaked = e.worker.run_sync(functools.partial(_blocks_left, e), timeout=60)
        e.worker.close()
        assert not leaked, f"the block pool still holds {leaked} blocks after every row ended"


def _blocks_left(engine: Engine) -> int:
    """Blocks the batch lane's pool holds once the prefix cache let go of its entries."""
    if engine.prefix is not None:
        engine.prefix.clear()
    stats = engine.batch_stats().get("kv_blocks")
    return int(stats["used"]) if stats else 0


def greedy(prompt: str, n: int = 12, **extra) -> dict:
    """A greedy completion body that reports token ids."""
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": True, **extra}


def within(seconds: float, fn):
    """``fn()``'s result or exception, failing the test if it has not returned in time (a
    dead worker would leave it waiting forever)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no answer within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


class GatedChunks(FixedChunk):
    """Prefill chunks of ``size`` tokens, counted (``count``, ``tokens``); the worker
    thread waits at the end of chunk ``pause_at`` until ``release()``, so a test acts
    at an exact chunk boundary instead of racing a timer."""

    def __init__(self, size: int, pause_at: int = 0):
        super().__init__(size)
        self.count, self.pause_at = 0, pause_at
        self.tokens: list[int] = []
        self._paused, self._go = threading.Event(), threading.Event()

    def record(self, tokens: int, seconds: float, asked: int = 0) -> None:
        self.count += 1
        self.tokens.append(tokens)
        if self.count == self.pause_at:
            self._paused.set()
            self._go.wait(60)

    def wait_paused(self, timeout: float = 30) -> None:
        assert self._paused.wait(timeout), f"prefill never reached chunk {self.pause_at}"

    def release(self) -> None:
        self._go.set()


def pace(engine: Engine, pacer: PrefillPacer) -> PrefillPacer:
    """Make every lane of ``engine`` size (and report) its prefill chunks with ``pacer``."""
    engine.pacer = pacer
    for lane in engine.worker.lanes:
        lane.pacer = pacer
    return pacer


def finish_of(events: list):
    """The ``Finish`` of a generation's events (cancelled ones included)."""
    from ..events import Done

    return next(ev.finish for ev in events if isinstance(ev, Done))


def drive_lane(engine: Engine, bodies: list, arrive: list, on_step=None) -> list:
    """Drive the engine's first lane by hand on the worker thread: ``bodies[i]`` is added
    after ``arrive[i]`` lane steps (0: before the first); ``on_step(step, jobs, lane)``
    runs after every step; step until every job ends. Each job's events, in body order.
    Jobs are made as :meth:`Engine.start` makes them (draft, prefix-cache namespace)."""
    lane = engine.worker.lanes[0]

    async def go():
        jobs = []
        for body in bodies:
            req = engine.parse_completion(body)
            prepared = await engine.prepare(req)
            jobs.append(engine.new_job(req, prepared, engine.adapters.resolve(req.adapter)))

        def steps():
            n = 0
            while True:
                for job, at in zip(jobs, arrive):
                    if at == n:
                        lane.add(job)
                if n >= max(arrive) and not (lane.active or lane.waiting):
                    return
                lane.step()
                n += 1
                if on_step is not None:
                    on_step(n, jobs, lane)

        await engine.worker.call(steps)
        return [await _events(job) for job in jobs]

    return asyncio.run(go())


def step_lane(engine: Engine, bodies: list, arrive: list, on_step=None) -> list:
    """:func:`drive_lane`; the finishes (cancelled ones included), in body order."""
    return [finish_of(events) for events in drive_lane(engine, bodies, arrive, on_step)]


def lane_replies(engine: Engine, bodies: list, arrive: list, on_step=None) -> list:
    """:func:`drive_lane`; the gathered replies, in body order."""
    return [gather(events) for events in drive_lane(engine, bodies, arrive, on_step)]


async def _events(job) -> list:
    from ..events import Done

    events: list = []
    while not any(isinstance(ev, Done) for ev in events):
        events += await job.sink.queue.get()
    return events
