"""A cancel, or a client that leaves, while the prompt is being read ends the job at the
next prefill chunk on every lane: a lone job (solo), rows reading their prompts
together in the batch, the serial lane with and without the prefix cache, speculative
decoding and the media pipeline. Chunks are pinned to a few tokens and the worker thread
is held at a chunk boundary (``GatedChunks``), so the tests count chunks instead of
timing them."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.job import GenerationJob
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing import media as M
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import (
    GatedChunks,
    close,
    finish_of,
    pace,
    run_all,
    step_lane,
    token_ids,
)
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.vision import QWEN_VL_TEMPLATE

LONG = "The quick brown fox jumps over the lazy dog " * 12
CHUNK = 8


def cancel_at_chunk(engine: Engine, start, pause_at: int = 2):
    """Start a request (``start()`` returns the Generation), cancel it while the worker is
    held after chunk ``pause_at``; its events and the gate."""
    gate = pace(engine, GatedChunks(CHUNK, pause_at))

    async def go():
        gen = await start()
        await asyncio.to_thread(gate.wait_paused)
        gen.cancel()
        gate.release()
        return [ev async for ev in gen.events()]

    return asyncio.run(go()), gate


def assert_cut_at_the_gate(events: list, gate: GatedChunks) -> None:
    fin = finish_of(events)
    assert fin.reason == "cancelled" and fin.usage.completion_tokens == 0
    assert fin.usage.prompt_tokens > 6 * CHUNK  # many chunks were still to read
    assert gate.count == gate.pause_at  # not one chunk after the cancel


@pytest.mark.parametrize("lane,options", [
    ("solo", {"batch": 8}),
    ("serial", {"batch": 1}),
    ("serial, prefix cache off", {"batch": 1, "prompt_cache_bytes": 0}),
    ("solo, hybrid cache", {"batch": 8, "model_type": "qwen3_5"}),
])
def test_cancel_during_prefill_ends_at_the_next_chunk(lane, options):
    options = dict(options)
    path = tiny_checkpoint(options.pop("model_type", "llama"))
    engine = Engine.load(str(path), progress=False, **options)
    try:
        body = {"prompt": LONG, "max_tokens": 4, "temperature": 0}
        events, gate = cancel_at_chunk(engine, lambda: engine.start(engine.parse_completion(body)))
        assert_cut_at_the_gate(events, gate)
        assert engine.worker.active == 0 and engine.worker.waiting == 0
    finally:
        close(engine)


def test_cancel_during_a_speculative_prefill():
    path = tiny_checkpoint("llama", seed=3)
    engine = Engine.load(str(path), LoadOptions(extra={"draft_model": str(path),
                                                       "num_draft_tokens": 2}), progress=False)
    try:
        body = {"prompt": LONG, "max_tokens": 4, "temperature": 0}
        events, gate = cancel_at_chunk(engine, lambda: engine.start(engine.parse_completion(body)))
        assert finish_of(events).usage.lane == "serial+spec"
        assert_cut_at_the_gate(events, gate)
    finally:
        close(engine)


def test_cancel_during_a_media_prefill():
    """The media pipeline prefills inside mlx-vlm; it stops at the chunk boundary after
    the cancel (the first boundary also ran the image encoder, so it is not measured)."""
    path = tiny_checkpoint("qwen3_vl", seed=4, vision=True, chat_template=QWEN_VL_TEMPLATE)
    engine = Engine.load(str(path), progress=False)
    try:
        png = M.image_bytes("PNG", size=(64, 48), seed=0)
        body = {"messages": [{"role": "user", "content": [
            M.image_part(png), {"type": "text", "text": LONG}]}], "max_tokens": 4,
            "temperature": 0}
        events, gate = cancel_at_chunk(engine, lambda: engine.start(engine.parse_chat(body)))
        assert finish_of(events).usage.lane == "serial"
        assert_cut_at_the_gate(events, gate)
    finally:
        close(engine)


def test_cancelling_a_row_in_the_prompt_batch_leaves_its_neighbour_exact():
    """Two prompts read together in one of the batch's prefill chunks; one is cancelled
    between chunks: it leaves the batch at the next step, the other reads on and
    answers exactly what it answers alone."""
    engine = Engine.load(str(tiny_checkpoint("llama")), progress=False, batch=8,
                         prompt_cache_bytes=0)
    try:
        bodies = [{"prompt": LONG, "max_tokens": 6, "temperature": 0, "logprobs": True},
                  {"prompt": "Once upon a time " * 10, "max_tokens": 6, "temperature": 0,
                   "logprobs": True}]
        want = token_ids(run_all(engine, bodies[1:])[0])
        gate, seen = pace(engine, GatedChunks(CHUNK)), {}

        def on_step(n, jobs, lane):
            if gate.count == 2 and "cancelled" not in seen:
                assert not lane.alone and len(lane._batch.prefilling) == 2
                jobs[0].cancel()
                seen["cancelled"] = n
            elif seen.get("cancelled") == n - 1:
                seen["ended"] = jobs[0].finished
                seen["prompt_rows"] = len(lane._batch.prefilling)

        cut, other = step_lane(engine, bodies, [0, 0], on_step)
        assert seen["ended"] and seen["prompt_rows"] <= 1
        assert cut.reason == "cancelled" and cut.usage.completion_tokens == 0
        assert other.reason == "length" and [e["id"] for e in other.logprobs] == want
    finally:
        close(engine)


# -- real HTTP clients that leave ------------------------------------------------------

@pytest.fixture(scope="module")
def servers():
    path = tiny_checkpoint("llama")
    made = {"solo": start_server(path), "serial": start_server(path, batch=1)}
    yield made
    for s in made.values():
        s.stop()


@pytest.mark.parametrize("lane,stream", [("solo", True), ("solo", False), ("serial", True)])
def test_client_leaving_during_prefill_ends_the_job(servers, lane, stream, monkeypatch):
    """The client closes its connection while the worker is held between chunks; once
    the server has seen it go, the worker is let go: the job ends without another chunk."""
    s = servers[lane]
    gate = pace(s.engine, GatedChunks(CHUNK, pause_at=2))
    seen_cancel, finished = threading.Event(), []
    real_cancel, real_finished = GenerationJob.cancel, s.engine._finished

    def cancel(job):
        seen_cancel.set()
        real_cancel(job)

    monkeypatch.setattr(GenerationJob, "cancel", cancel)
    monkeypatch.setattr(s.engine, "_finished", lambda fin, *note: (finished.append(fin),
                                                                   real_finished(fin, *note)))

    async def client():
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"prompt": LONG, "max_tokens": 4, "stream": stream}
            async with c.stream("POST", s.v1 + "/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    pass

    async def main():
        task = asyncio.ensure_future(client())
        await asyncio.to_thread(gate.wait_paused)
        task.cancel()  # the client goes away mid-prompt
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(seen_cancel.wait, 30), "the server never saw it go"
        gate.release()

    asyncio.run(main())
    for _ in range(600):
        if finished and s.engine.worker.active == 0:
            break
        threading.Event().wait(0.05)
    assert len(finished) == 1 and finished[0].reason == "cancelled"
    assert finished[0].usage.completion_tokens == 0 and gate.count == 2
    assert s.engine.worker.active == 0 and s.engine.worker.waiting == 0
