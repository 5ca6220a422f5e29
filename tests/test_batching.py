"""Continuous batching: batched greedy output equals serial, token for token, on every
family's tiny checkpoint (Gemma's sliding window and Qwen3.5's hybrid cache included)
and on the real default model; per-row samplers and sampler extensions work inside a
batch; a cancelled row leaves the batch at the next step."""

from __future__ import annotations

import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, engines, greedy, run_all, step_lane, token_ids

FAMILIES = ["llama", "qwen3", "gemma3_text", "gemma4_text", "qwen3_5", "glm_moe_dsa", "minicpm5"]
PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog " * 3, "a b c", "x" * 40,
           "Once upon a time in a land far away", "1 2 3 4 5 6 7 8 9 10 11 12"]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_batched_greedy_equals_serial(model_type):
    batched, serial = engines(tiny_checkpoint(model_type))
    try:
        bodies = [greedy(p) for p in PROMPTS]
        got = run_all(batched, bodies)
        want = [run_all(serial, [b])[0] for b in bodies]  # one at a time
        assert [r.finish.usage.lane for r in got] == ["batched"] * len(bodies)
        assert [r.finish.usage.lane for r in want] == ["serial"] * len(bodies)
        assert [token_ids(r) for r in got] == [token_ids(r) for r in want]
        assert [r.content for r in got] == [r.content for r in want]
    finally:
        close(batched, serial)


def test_batched_greedy_equals_serial_on_the_default_model(smollm2_path):
    """One engine: unseeded greedy requests batch; a seed sends the same greedy request to
    the serial lane (alone), so both lanes run on one loaded model."""
    engine = Engine.load(str(smollm2_path), progress=False, batch=8, prompt_cache_bytes=0)
    try:
        bodies = [greedy(p, 10) for p in ["What is the capital of France?", "def fib(n):",
                                           "2 + 2 ="]]
        got = run_all(engine, bodies)
        want = [run_all(engine, [dict(b, seed=1)])[0] for b in bodies]
        assert {r.finish.usage.lane for r in got} == {"batched"}
        assert {r.finish.usage.lane for r in want} == {"serial"}
        assert [token_ids(r) for r in got] == [token_ids(r) for r in want]
    finally:
        close(engine)


def test_sampler_extensions_work_per_row():
    """Penalties and logit_bias on one row leave its neighbours alone."""
    batched, serial = engines(tiny_checkpoint("qwen3"))
    try:
        plain = greedy("Hello there", 10)
        ban = run_all(serial, [plain])[0]
        banned = token_ids(ban)[0]
        biased = greedy("Hello there", 10, logit_bias={str(banned): -100})
        penal = greedy("Hello there", 10, repetition_penalty=1.5, frequency_penalty=0.5)
        bodies = [plain, biased, penal, plain]
        got = run_all(batched, bodies)
        want = [run_all(serial, [b])[0] for b in bodies]
        assert [token_ids(r) for r in got] == [token_ids(r) for r in want]
        assert token_ids(got[1])[0] != banned and token_ids(got[0])[0] == banned
    finally:
        close(batched, serial)


def test_seeded_requests_run_serially_and_reproduce():
    batched, _ = engines(tiny_checkpoint("qwen3"))
    try:
        body = {"prompt": "Once", "max_tokens": 10, "temperature": 1.0, "seed": 7, "logprobs": True}
        noise = {"prompt": "Noise", "max_tokens": 10, "temperature": 1.0}
        a = run_all(batched, [body, noise, noise])[0]
        b = run_all(batched, [noise, body])[1]
        assert a.finish.usage.lane == b.finish.usage.lane == "serial"
        assert token_ids(a) == token_ids(b)
    finally:
        close(batched)


def test_a_cancelled_row_leaves_the_batch_at_the_next_step():
    """Three rows decode together and the one with a long budget is cancelled mid-decode:
    it ends at the next step (it would otherwise decode 400 tokens), the batch goes on
    with two rows, and theirs are the tokens each gets alone."""
    batched, serial = engines(tiny_checkpoint("llama"))
    try:
        bodies = [greedy("Hello there", 12), greedy(PROMPTS[1], 400), greedy("a b c", 12)]
        want = [token_ids(run_all(serial, [b])[0]) for b in (bodies[0], bodies[2])]
        seen = {}

        def on_step(n, jobs, lane):
            if "cancelled_at" not in seen and all(j.session.usage.completion_tokens >= 2
                                                  for j in jobs):
                assert len(lane._rows) == 3 and not lane.alone
                jobs[1].cancel()
                seen["cancelled_at"] = n
            elif seen.get("cancelled_at") == n - 1:
                seen["ended"], seen["rows"] = jobs[1].finished, len(lane._rows)

        fins = step_lane(batched, bodies, [0, 0, 0], on_step)
        assert seen["ended"] and seen["rows"] == 2
        assert fins[1].reason == "cancelled" and fins[1].usage.completion_tokens < 12
        assert [[e["id"] for e in f.logprobs] for f in (fins[0], fins[2])] == want
    finally:
        close(batched, serial)


@pytest.mark.parametrize("bodies,arrive", [
    (["hot", "greedy"], [0, 0]),  # one fresh batch
    (["hot", "greedy"], [0, 3]),  # the greedy row joins a sampled lone job
    (["greedy", "hot"], [0, 3]),  # a sampled row joins a greedy lone job
], ids=["together", "greedy-joins", "sampled-joins"])
def test_every_row_samples_with_its_own_sampler(bodies, arrive):
    """A temperature-2 row and a greedy row over the same prompt share a batch: the
    greedy row's tokens are exactly greedy and the sampled row's are not, whichever came
    first (a joining row must not inherit the running row's sampler, nor the batch's).
    The sampled row is the shorter, so it ends inside the batch, never decoding alone."""
    batched, serial = engines(tiny_checkpoint("qwen3"))
    try:
        made = {"greedy": greedy("Hello there", 16),
                "hot": {"prompt": "Hello there", "max_tokens": 8, "temperature": 2.0,
                        "logprobs": True}}
        want = token_ids(run_all(serial, [made["greedy"]])[0])
        fins = step_lane(batched, [made[b] for b in bodies], arrive)
        ids = {b: [e["id"] for e in f.logprobs] for b, f in zip(bodies, fins)}
        assert ids["greedy"] == want
        assert ids["hot"] != want[:len(ids["hot"])]
    finally:
        close(batched, serial)
