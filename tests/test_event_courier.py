"""The worker's events reach the event loop in as few wake-ups as it can: a decode step
hands out a token per row, and each wake-up of the loop is a GIL hand-over between the
worker and the loop's thread."""

from __future__ import annotations

import asyncio
import threading
import time

from mlxbun_core.engine.job import EventSink, posts_held
from mlxbun_core.events import Content


def test_posts_held_for_a_step_wake_the_loop_once_after_it():
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    wakes = []
    schedule = loop.call_soon_threadsafe

    def counted(callback, *args, **kw):
        if getattr(callback, "__name__", "") == "_deliver":  # (the courier's)
            wakes.append(time.perf_counter())
        return schedule(callback, *args, **kw)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        sinks = [EventSink(loop) for _ in range(8)]
        with posts_held():  # (this thread is the worker)
            for i, sink in enumerate(sinks):
                sink.post([Content(str(i))])
            time.sleep(0.05)  # a loop woken by a post would have delivered by now
            assert wakes == [] and all(s.queue.empty() for s in sinks)
        got = [asyncio.run_coroutine_threadsafe(s.get(), loop).result(10) for s in sinks]
        assert got == [[Content(str(i))] for i in range(8)] and len(wakes) == 1
        sinks[0].post([Content("late")])  # outside a hold a post wakes the loop itself
        assert asyncio.run_coroutine_threadsafe(sinks[0].get(), loop).result(10) == \
            [Content("late")] and len(wakes) == 2
    finally:
        schedule(loop.stop)
        runner.join()
        loop.close()
