"""In-process engine helpers: run request bodies straight on an :class:`Engine` (no HTTP)
and compare what lanes produce, token for token."""

from __future__ import annotations

import asyncio
import threading

from ..engine.core import Engine
from ..engine.reply import gather


def run_all(engine: Engine, bodies: list) -> list:
    """Start every completion body at once on ``engine``; the gathered replies."""
    async def go():
        gens = [await engine.start(engine.parse_completion(b)) for b in bodies]
        return await asyncio.gather(*[collect(g) for g in gens])

    async def collect(gen):
        return gather([ev async for ev in gen.events()])

    return asyncio.run(go())


def token_ids(reply) -> list:
    """The sampled token ids of a reply started with ``"logprobs": True``."""
    return [e["id"] for e in reply.finish.logprobs]


def engines(path, **kw) -> tuple[Engine, Engine]:
    """The same checkpoint loaded twice: batched (``batch=8``) and serial (``batch=1``),
    prefix cache off so both compute every token."""
    batched = Engine.load(str(path), progress=False, batch=8, prompt_cache_bytes=0, **kw)
    serial = Engine.load(str(path), progress=False, batch=1, prompt_cache_bytes=0, **kw)
    return batched, serial


def close(*engs: Engine) -> None:
    for e in engs:
        e.worker.close()


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
