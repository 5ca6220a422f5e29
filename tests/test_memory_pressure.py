"""Memory pressure on the batch lane: rows preempted by an out-of-memory (injected as MLX
raises it, ``MLXBUN_FAULT_ALLOC``) or by a pool that ran out of blocks under a small
free-memory reading are recomputed from their tokens, and what comes out equals mlx-lm's
own ``generate_step`` (greedy, float32 on the CPU) on every cache kind: full attention,
sliding windows, a recurrent hybrid. Grammar rows with forced runs keep their grammar; a
request that cannot fit waits, runs once memory returns, and is told 503 with a sane
``Retry-After`` once its wait runs out; a sticky device fault ends every request with a
503 to send again and marks the engine unavailable. The pool ends empty every time."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.memory import DEVICE_FAULT, MEMORY_PRESSURE, MemoryConfig
from mlxbun_core.engine.readings import Reading
from mlxbun_core.engine.reply import gather
from mlxbun_core.errors import Overloaded
from mlxbun_core.events import Done
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, finishes, greedy, run_all, token_ids

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog " * 3, "a b c",
           "x" * 40, "Once upon a time in a land far away", "1 2 3 4 5 6 7 8 9 10 11 12"]
FAMILIES = {"llama": {}, "qwen3_5": {},
            "gemma3_text": {"config_overrides": {"sliding_window": 8,
                                                 "sliding_window_pattern": 2}}}


def checkpoint(family: str):
    return tiny_checkpoint(family, seed=3, dtype="float32", **FAMILIES[family])


def reference(path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """mlx-lm's own greedy decode of each prompt, uninterrupted."""
    model = load(str(path))[0]
    return [[int(t) for t, _ in generate_step(mx.array(p), model, max_tokens=n,
                                              sampler=lambda x: mx.argmax(x, axis=-1))]
            for p in prompts]


def equal_to(replies: list, want: list[list[int]]) -> None:
    """Each reply's tokens are the reference's, up to the end of sequence where the reply
    stopped (mlx-lm's loop decodes on past it)."""
    for reply, ref in zip(replies, want, strict=True):
        got = token_ids(reply)
        assert got == ref[:len(got)]
        assert len(got) == len(ref) or reply.finish.reason == "stop"


def prompt_ids(engine: Engine, bodies: list[dict]) -> list[list[int]]:
    async def go():
        return [(await engine.prepare(engine.parse_completion(b))).request.prompt_tokens
                for b in bodies]
    return asyncio.run(go())


def engine(path, **memory) -> Engine:
    return Engine.load(str(path), progress=False, batch=8, prompt_cache_bytes=0,
                       memory=MemoryConfig(**memory))


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_preempted_by_out_of_memory_equal_an_uninterrupted_run(family):
    """Every fifth pass fails as MLX's out-of-memory does: the lane frees the pool and
    MLX's cache, preempts every row and recomputes each from its prompt and output."""
    path = checkpoint(family)
    e = engine(path, fault_alloc=5)
    try:
        bodies = [greedy(p, 16) for p in PROMPTS]
        got = run_all(e, bodies)
        equal_to(got, reference(path, prompt_ids(e, bodies), 16))
        counts = e.memory.counts
        assert counts["out_of_memory"] >= 5 and counts["preemptions"] >= 5, counts
        assert counts["refused"] == 0
        assert {r.finish.usage.lane for r in got} == {"batched"}
    finally:
        close(e)


def test_rows_preempted_for_blocks_equal_an_uninterrupted_run():
    """A device of room for ``ROOM`` blocks (the reading is what the pool leaves free):
    the pool stops growing where it would cut into the room a step's temporaries keep
    (stepfit.py), short of what the six rows take by their end. Admission packs the
    prompts in; rows that need a block as they decode find none, and the youngest are
    preempted and recomputed."""
    path = checkpoint("llama")
    e = engine(path, margin_bytes=0)
    lane = e.worker.lanes[0]
    per_block = int(e.admission.layout.bytes_per_token * 16)
    room = 460 * per_block

    def pool_bytes() -> int:
        stats = lane.pool_stats()
        return 0 if stats is None else int(stats["bytes"])

    e.memory.probe = lambda: Reading(room - pool_bytes(), 0, "test")
    try:
        bodies = [greedy(" ".join(str((i * 7 + j) % 50) for j in range(120 + 20 * i)), 80)
                  for i in range(6)]
        prompts = prompt_ids(e, bodies)
        got = run_all(e, bodies)
        equal_to(got, reference(path, prompts, 80))
        counts = e.memory.counts
        assert counts["out_of_blocks"] >= 1 and counts["preemptions"] >= 1, counts
        blocks = e.batch_stats()["kv_blocks"]
        at_end = sum(-(-(len(p) + 80) // 16) for p in prompts)  # the rows' blocks at the end
        assert blocks["limit"] < at_end and blocks["swapped"] == 0, (blocks, at_end)
        assert blocks["bytes"] + e.memory.step["reserve_bytes"] <= room, blocks
    finally:
        close(e)


def test_preempted_rows_with_a_prefix_cache_recompute_from_a_hit():
    """With the prefix cache on, a repeated prompt hits; out-of-memory resets drop the
    pool's entries with it, and resumed rows look their tokens up again."""
    path = checkpoint("llama")
    e = Engine.load(str(path), progress=False, batch=8, memory=MemoryConfig(fault_alloc=6))
    try:
        bodies = [greedy(p, 12) for p in PROMPTS[:4]]
        want = reference(path, prompt_ids(e, bodies), 12)
        for _ in range(2):
            equal_to(run_all(e, bodies), want)
        assert e.prefix.stats()["hits"] >= 1 and e.memory.counts["preemptions"] >= 1
    finally:
        close(e)


FIELDS = {f"f{i}": ({"type": "integer", "minimum": 0, "maximum": 9} if i % 2 else
                    {"enum": ["red", "green", "blue"]}) for i in range(8)}
RECORD = {"type": "json_schema", "json_schema": {"name": "record", "schema": {
    "type": "object", "properties": FIELDS, "required": list(FIELDS),
    "additionalProperties": False}}}


def chat(engine: Engine, bodies: list[dict]) -> list:
    async def go():
        gens = [await engine.start(engine.parse_chat(b)) for b in bodies]
        return await asyncio.gather(*[finished(g) for g in gens])

    async def finished(gen):
        return gather([ev async for ev in gen.events()])

    return asyncio.run(go())


def test_grammar_rows_with_forced_runs_keep_their_grammar_when_preempted():
    """JSON-schema rows with forced-token fill: a failed window step had consumed a token
    and its forced run in the matcher; they are handed out before the row is preempted,
    so the recomputed row meets its grammar where the grammar is. Same replies as a run
    with no failures."""
    path = tiny_checkpoint("llama", seed=3)
    plain = Engine.load(str(path), progress=False, batch=8, prompt_cache_bytes=0,
                        fill="strict")
    faulty = Engine.load(str(path), progress=False, batch=8, prompt_cache_bytes=0,
                         fill="strict", memory=MemoryConfig(fault_alloc=4))
    try:
        bodies = [{"messages": [{"role": "user", "content": ask}], "max_tokens": 60,
                   "temperature": 0, "response_format": RECORD}
                  for ask in ("Give me a record.", "Another record, please.")]
        bodies.append({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30,
                       "temperature": 0})
        want, got = chat(plain, bodies), chat(faulty, bodies)
        assert [r.content for r in got] == [r.content for r in want]
        assert [r.finish.usage.completion_tokens for r in got] == \
            [r.finish.usage.completion_tokens for r in want]
        assert got[0].finish.usage.fill is not None
        assert faulty.memory.counts["preemptions"] >= 2
    finally:
        close(plain, faulty)


def test_a_request_that_cannot_fit_waits_and_runs_once_memory_returns():
    path = checkpoint("llama")
    e = engine(path, margin_bytes=0, wait_s=30)
    e.memory.probe = lambda: Reading(0, 0, "test")  # another process holds everything
    freed = threading.Timer(1.5, lambda: setattr(e.memory, "probe",
                                                 lambda: Reading(1 << 30, 0, "test")))
    try:
        freed.start()
        t0 = time.monotonic()
        (reply,) = run_all(e, [greedy("Hello there", 8)])
        assert time.monotonic() - t0 >= 1.4 and reply.finish.reason == "length"
        assert e.memory.counts["refused"] == 0
    finally:
        freed.cancel()
        close(e)


def test_a_wait_past_the_limit_is_a_503_with_retry_after_and_the_next_request_runs():
    path = checkpoint("llama")
    e = engine(path, margin_bytes=0, wait_s=0.5)
    e.memory.probe = lambda: Reading(0, 0, "test")
    try:
        t0 = time.monotonic()
        done = finishes(e, [greedy("Hello there", 8), greedy("a b c", 8)])
        assert 0.5 <= time.monotonic() - t0 < 10
        assert [f.reason for f in done] == ["error", "error"]
        assert {f.retry.code for f in done} == {MEMORY_PRESSURE}
        with pytest.raises(Overloaded) as refused:  # what a surface answers
            gather([Done(done[0])])
        err = refused.value
        assert err.status == 503 and 1 <= err.retry_after <= 30
        assert err.headers() == {"Retry-After": str(err.retry_after)}
        assert e.memory.counts["refused"] == 2
        e.memory.probe = lambda: Reading(1 << 30, 0, "test")
        e.memory.available(fresh=True)  # (read now, not within the second)
        (reply,) = run_all(e, [greedy("Hello there", 8)])
        assert reply.finish.reason == "length"
    finally:
        close(e)


def test_a_sticky_device_fault_ends_every_request_with_a_503_to_send_again():
    path = checkpoint("llama")
    e = engine(path, fault_device=3)
    lost: list[str] = []
    e.on_fatal = lost.append
    try:
        # (all queued before step 3's fault: a request started after it is refused at
        # once, a 503 too, but no Finish to look at)
        done = finishes(e, [greedy(p, 30) for p in PROMPTS], together=True)
        assert all(f.reason == "error" and f.retry is not None for f in done)
        assert {f.retry.code for f in done} == {DEVICE_FAULT}
        assert lost and "illegal memory access" in lost[0]
        assert e.unavailable is not None and e.worker.broken
        assert e.memory.counts["device_faults"] == 1
        with pytest.raises(Overloaded) as refused:  # new work: a 503 to send again
            e.check_open()
        assert refused.value.restarting and refused.value.retry_after >= 2
        assert refused.value.headers()["X-Mlxbun-Restarting"] == "1"
    finally:
        e.worker.close()


def test_an_out_of_memory_that_persists_with_one_request_left_is_a_lost_device():
    """Every step fails (``MLXBUN_FAULT_ALLOC=1``): freeing the cache and the pool and
    preempting do not help, so after three failures in a row with one request held the
    device counts as lost, not as memory pressure to wait out."""
    e = engine(checkpoint("llama"), fault_alloc=1)
    try:
        (done,) = finishes(e, [greedy("Hello there", 8)])
        assert done.reason == "error" and done.retry is not None
        assert done.retry.code == DEVICE_FAULT and "keep failing" in (done.error or "")
        counts = e.memory.counts
        assert counts["out_of_memory"] == 3 and counts["device_faults"] == 1, counts
        assert e.unavailable is not None
    finally:
        e.worker.close()


def test_an_out_of_memory_that_persists_while_memory_reads_short_is_a_503_not_a_lost_device():
    """Another process holds the device (the reading is short once the first pass
    failed): the last request's failures are pressure, not a broken device. It gets a
    503 to send again and the engine serves the next request once memory is back (an
    H100 under another tenant had ended the engine this way, with 30 streams cut)."""
    e = engine(checkpoint("llama"), fault_alloc=1)
    counts = e.memory.counts
    e.memory.probe = lambda: Reading(0 if counts["injected"] >= 3 else 1 << 34, 0, "test")
    try:
        (done,) = finishes(e, [greedy("Hello there", 8)])
        assert done.reason == "error" and done.retry is not None
        assert done.retry.code == MEMORY_PRESSURE and 1 <= done.retry.after <= 30
        assert "not enough memory" in (done.error or "")
        assert counts["out_of_memory"] == 3 and counts["device_faults"] == 0, counts
        assert counts["refused"] == 1 and e.unavailable is None
        e.memory.config = dataclasses.replace(e.memory.config, fault_alloc=0)
        e.memory.probe = lambda: Reading(1 << 34, 0, "test")
        e.memory.available(fresh=True)
        (reply,) = run_all(e, [greedy("Hello there", 8)])
        assert reply.finish.reason == "length"
    finally:
        close(e)


def test_a_device_fault_met_while_memory_is_freed_ends_the_engine(monkeypatch):
    """A pass ran out of memory, and giving MLX's cache back then met the device's
    sticky fault (two 8B servers on one H100: ``cudaStreamSynchronize ... an illegal
    memory access``). That is a lost device, not a lane's internal error under a
    healthy-looking ``/health``: every request ends with a 503 to send again."""
    e = engine(checkpoint("llama"), fault_alloc=4)
    lost: list[str] = []
    e.on_fatal = lost.append
    real = mx.clear_cache
    calls = {"n": 0}

    def clear() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("cudaStreamSynchronize(free_streams_[i]) failed: an illegal "
                               "memory access was encountered")
        real()

    monkeypatch.setattr(mx, "clear_cache", clear)
    try:
        done = finishes(e, [greedy(p, 30) for p in PROMPTS[:3]], together=True)
        assert all(f.reason == "error" and f.retry is not None for f in done)
        assert {f.retry.code for f in done} == {DEVICE_FAULT}, [f.error for f in done]
        assert lost and "illegal memory access" in lost[0]
        assert e.unavailable is not None and e.memory.counts["device_faults"] == 1
    finally:
        e.worker.close()


def test_the_pool_limit_follows_the_reading_between_requests():
    """Another process takes memory: the next step's reading lowers the pool's limit (not
    below what the pool holds); it leaves: the limit grows back, without a restart."""
    e = engine(checkpoint("llama"), margin_bytes=0)
    free = {"blocks": 10_000}
    try:
        two = [greedy("Hello there", 4), greedy("a b c", 4)]  # (a lone one runs outside)
        run_all(e, two)
        per_block = e.batch_stats()["kv_blocks"]["bytes_per_block"]
        assert per_block > 0
        e.memory.probe = lambda: Reading(free["blocks"] * per_block, 0, "test")
        seen = []
        for blocks in (500, 100, 10, 5000):
            free["blocks"] = blocks
            e.memory.available(fresh=True)
            held = e.batch_stats()["kv_blocks"]["bytes"]
            run_all(e, two)
            # less the room the pool's growth keeps for a step (stepfit.py) and what the
            # pool grew by since the reading (a short reading trimmed it: lanes/idle.py),
            # plus what a growth's copy frees of the old storage (all but a layer's)
            grown = e.batch_stats()["kv_blocks"]["bytes"] - held
            room = blocks * per_block - e.memory.step["reserve_bytes"] - grown \
                + e.worker.lanes[0]._batch.layout.regrown_bytes()
            seen.append({**e.batch_stats()["kv_blocks"], "room": room // per_block})
        capacity = seen[2]["capacity"] + 1  # (the stats leave out the trash block)
        assert [s["limit"] + 1 for s in seen[:2]] == [s["room"] for s in seen[:2]], seen
        assert seen[2]["limit"] + 1 == capacity, seen
        assert seen[3]["limit"] + 1 == seen[3]["room"], seen
        assert e.memory.stats()["available_bytes"] == 5000 * per_block
    finally:
        close(e)
