"""A lone job on the batch lane decodes outside the BatchGenerator, joins the batch when
company arrives, and leaves it again when the batch drains to it. The lane is driven step
by step through its protocol (add / step / active) on the worker thread, so the hand-off
lands exactly where each test puts it: before the first token, mid-prefill, mid-decode,
on the job's last token and at the batch's end. Output must equal the serial lane's,
token for token, on every cache kind."""

from __future__ import annotations

import itertools

import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, engines, greedy, lane_replies, run_all, token_ids

LONG = "The quick brown fox jumps over the lazy dog " * 4


def drive(engine: Engine, bodies: list, joins: list, solo_prefill: int = 2048,
          watch: list | None = None) -> list:
    """Add ``bodies[0]`` alone; after ``joins[i]`` lane steps add ``bodies[i + 1]``;
    step until every job ends; the replies. Asserts the first job ran alone until the
    second arrived. ``watch`` gets whether a job ran alone after each later step."""
    arrive = [0, *itertools.accumulate(joins)]
    engine.worker.lanes[0].solo_prefill = solo_prefill

    def on_step(n, jobs, lane):
        if n == joins[0]:
            assert lane.alone or jobs[0].finished
        if watch is not None and n > arrive[-1] and lane.active:
            watch.append(lane.alone)

    return lane_replies(engine, bodies, arrive, on_step)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "qwen3_5"])
def test_lone_and_joining_jobs_equal_the_serial_lane(model_type):
    """Full, sliding-window and hybrid (non-rewindable) caches; the second job joins
    before the first token, after one token and mid-decode; the first carries penalties,
    so its processors' context must survive the move."""
    batched, serial = engines(tiny_checkpoint(model_type))
    try:
        first = greedy(LONG, 16, repetition_penalty=1.3, presence_penalty=0.5)
        other = greedy("Hello there", 12)
        want = [run_all(serial, [b])[0] for b in (first, other)]
        alone = run_all(batched, [first])[0]
        assert alone.finish.usage.lane == "batched"
        assert token_ids(alone) == token_ids(want[0])
        for join in (0, 1, 2, 7):
            got = drive(batched, [first, other], [join])
            assert [token_ids(r) for r in got] == [token_ids(r) for r in want], join
            assert [r.content for r in got] == [r.content for r in want]
    finally:
        close(batched, serial)


def test_join_during_a_chunked_prefill():
    """A long prompt read in small chunks: company arriving mid-prompt takes the rest of
    it into the batch (with the prompt-boundary snapshot for caches that cannot rewind)."""
    batched, serial = engines(tiny_checkpoint("qwen3_5"))
    try:
        first, other = greedy(LONG, 10), greedy("a b c", 10)
        want = [run_all(serial, [b])[0] for b in (first, other)]
        for join in (1, 3):
            got = drive(batched, [first, other], [join], solo_prefill=8)
            assert [token_ids(r) for r in got] == [token_ids(r) for r in want], join
    finally:
        close(batched, serial)


def test_join_on_the_last_token_and_three_arrivals():
    """The token computed at hand-off is the lone job's last: it ends there and never
    enters the batch; later arrivals batch as usual."""
    batched, serial = engines(tiny_checkpoint("llama"))
    try:
        bodies = [greedy(LONG, 4), greedy("Hello there", 6), greedy("x y z", 6)]
        want = [run_all(serial, [b])[0] for b in bodies]
        for joins in ([4, 0], [3, 0], [2, 2]):
            got = drive(batched, bodies, joins)
            assert [token_ids(r) for r in got] == [token_ids(r) for r in want], joins
            assert [r.finish.reason for r in got] == ["length"] * 3
        assert batched.worker.active == 0
    finally:
        close(batched, serial)


def test_a_lone_job_publishes_its_prefix():
    """A lone turn stores its KV: the next turn over the same history is a hit with the
    same output as a cold start."""
    path = tiny_checkpoint("qwen3_5")
    warm = Engine.load(str(path), progress=False, batch=8)
    cold = Engine.load(str(path), progress=False, batch=8, prompt_cache_bytes=0)
    try:
        turn1 = greedy(LONG, 8)
        a = run_all(warm, [turn1])[0]
        turn2 = greedy(LONG + a.content + " and then", 8)
        hot = run_all(warm, [turn2])[0]
        assert hot.finish.usage.cached_tokens > 0
        assert token_ids(hot) == token_ids(run_all(cold, [turn2])[0])
    finally:
        close(warm, cold)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "qwen3_5"])
def test_the_last_row_of_a_batch_goes_on_alone(model_type):
    """Two jobs batch; the short one ends and the long one leaves the BatchGenerator with
    the token it had already sampled, then runs alone to the end: same tokens as the
    serial lane (penalties included)."""
    batched, serial = engines(tiny_checkpoint(model_type))
    try:
        long = greedy(LONG, 24, repetition_penalty=1.3)
        short = greedy("Hello there", 3)
        want = [run_all(serial, [b])[0] for b in (long, short)]
        seen = []
        got = drive(batched, [long, short], [0], watch=seen)
        assert [token_ids(r) for r in got] == [token_ids(r) for r in want]
        assert seen[0] is False and seen[-1] is True  # batched first, alone at the end
    finally:
        close(batched, serial)

