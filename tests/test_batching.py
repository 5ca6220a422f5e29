"""Continuous batching: batched greedy output equals serial, token for token, on every
family's tiny checkpoint (Gemma's sliding window and Qwen3.5's hybrid cache included)
and on the real default model; per-row sampler extensions work inside a batch."""

from __future__ import annotations

import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, engines, greedy, run_all, token_ids

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
