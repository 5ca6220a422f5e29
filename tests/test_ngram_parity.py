"""Prompt-lookup speculation decodes exactly what plain decoding does.

Greedy output equals mlx-lm's ``generate_step`` token for token on the lone-stream path
(batch lane, one request) and the serial lane (``--batch 1``), on full-attention,
sliding-window (including a window that wraps mid-reply, where drafting stops) and
hybrid caches (which cannot rewind: those decode plainly and report no speculation).
Sampled output keeps the target distribution: a chi-square test over every 3-token
continuation of a small-vocabulary bigram model, speculative against exact.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.speculate import PromptLookup, SpecConfig, SpecStream
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, run_all, token_ids
from mlxbun_core.testing.helpers import OffsetCache, mlx_lm_greedy

# an echo-heavy prompt: a block of text, then the start of it again
BLOCK = "alpha beta gamma delta 12 34 56 epsilon zeta eta theta iota kappa lambda mu "
PROMPT = BLOCK * 3 + BLOCK[:40]
N = 60  # the prompt is 148 tokens: the sliding window below wraps at token 42


def brute_match(tokens: list[int], lo: int, hi: int) -> tuple[int, int]:
    n = len(tokens)
    for k in range(min(hi, n - 1), lo - 1, -1):
        tail = tokens[n - k:]
        for end in range(k, n):
            if tokens[end - k:end] == tail:
                return end, k
    return 0, 0


def test_lookup_matches_brute_force_and_grows():
    rng = np.random.default_rng(1)
    for _ in range(300):
        toks = rng.integers(0, 5, rng.integers(1, 40)).tolist()
        lo = int(rng.integers(1, 3))
        hi = lo + int(rng.integers(0, 3))
        lookup = PromptLookup(toks[:1], hi, lo)
        lookup.extend(toks[1:])
        assert lookup.match() == brute_match(toks, lo, hi), (toks, lo, hi)
    lookup = PromptLookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2], 3, 1)
    assert lookup.propose(3) == [3, 9, 1]  # longest (1 2), its first occurrence
    lookup.extend([5] * 1000)  # past the first allocation
    assert len(lookup) == 1010 and lookup.propose(2) == [5, 5]
    assert PromptLookup([4, 5, 6], 3, 1).propose(4) == []


def _engine(path, batch: int) -> Engine:
    return Engine.load(str(path), progress=False, batch=batch, prompt_cache_bytes=0,
                       speculation=SpecConfig())


# seeds whose replies both accept and reject drafts (random weights loop, then break out)
CASES = {
    "llama": {"seed": 3},
    "qwen3": {"seed": 4},
    "gemma3_text": {"seed": 3, "config_overrides": {"sliding_window": 190}},  # wraps mid-reply
    "qwen3_5": {},  # hybrid: recurrent layers cannot rewind
}


@pytest.mark.parametrize("model_type", list(CASES))
def test_greedy_equals_mlx_lm_on_both_paths(model_type):
    path = tiny_checkpoint(model_type, **CASES[model_type])
    model, tok = mlx_load(str(path))
    want = mlx_lm_greedy(model, tok.encode(PROMPT), N, tok.eos_token_ids)
    for batch in (8, 1):  # the lone stream of the batch lane, then the serial lane
        engine = _engine(path, batch)
        try:
            (reply,) = run_all(engine, [greedy(PROMPT, N)])
        finally:
            close(engine)
        assert token_ids(reply) == want, (model_type, batch)
        spec = reply.finish.usage.speculation
        if model_type == "qwen3_5":
            assert spec is None  # decoded plainly, and says so by leaving the field out
        else:
            # drafts were accepted and rejected (so rejected ones were trimmed)
            assert spec is not None and spec["drafted"] > spec["accepted"] > 0


def test_echo_accepts_drafts_and_saves_forwards():
    path = tiny_checkpoint("llama", seed=3)
    engine = _engine(path, 8)
    try:
        (reply,) = run_all(engine, [greedy(PROMPT, 60)])
    finally:
        close(engine)
    spec = reply.finish.usage.speculation
    assert spec["accepted"] > 0
    # fewer target forwards than tokens (the last burst may run past max_tokens)
    assert spec["targetCalls"] < reply.finish.usage.completion_tokens


# -- sampled: the target distribution, exactly -------------------------------------------

class _Bigram:
    """Next-token logits that depend on the input token only."""

    def __init__(self, table):
        self.table = table

    def __call__(self, inputs, cache):
        cache[0].offset += inputs.shape[1]
        return self.table[inputs]


def test_sampled_output_keeps_the_target_distribution():
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    V, runs, steps = 4, 2400, 3
    rng = np.random.default_rng(7)
    # peaked rows, so drafts from the echo-heavy history often land, and sometimes not
    logits = rng.normal(0, 1.5, (V, V)).astype(np.float32)
    table = mx.array(logits)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    history = [0, 1, 2, 3, 0, 1, 2, 0, 1, 3, 0, 1, 2, 3, 0, 1]
    sampler = make_sampler(temp=1.0)
    mx.random.seed(11)
    counts: dict[tuple[int, ...], int] = {}
    drafted = accepted = 0
    for _ in range(runs):
        usage = {"drafted": 0, "accepted": 0, "targetCalls": 0}
        stream = SpecStream(_Bigram(table), [OffsetCache()], list(history[:-1]),
                            SpecConfig(num_draft_tokens=3), sampler, [], usage)
        stream.begin(history[-1])
        stream.gate.hot = True  # send drafts from the first step (3 tokens are too few to warm up)
        out: list[int] = []
        while len(out) < steps:
            out += [t for t, _ in stream.step()]
        key = tuple(out[:steps])
        counts[key] = counts.get(key, 0) + 1
        drafted, accepted = drafted + usage["drafted"], accepted + usage["accepted"]
    assert 0 < accepted < drafted  # drafts were verified, some accepted, some not
    chi2 = 0.0
    for key in itertools.product(range(V), repeat=steps):
        p, prev = 1.0, history[-1]
        for t in key:
            p, prev = p * probs[prev, t], t
        chi2 += (counts.get(key, 0) - runs * p) ** 2 / (runs * p)
    dof = V ** steps - 1
    # p < 0.001 rejects: the normal approximation of chi-square's upper tail
    limit = dof + 3.09 * math.sqrt(2 * dof)
    assert chi2 < limit, (chi2, limit)


def test_batch_lane_rows_speculate_together_and_equal_mlx_lm():
    """Five echo-heavy and plain prompts at once: rows propose their own drafts, rows
    without decode normally in the same step; every reply equals mlx-lm's alone."""
    code = "def add(a, b):\n    return a + b\n\nclass Foo:\n    pass\n"
    prompts = [PROMPT, BLOCK * 2 + BLOCK[:30], code * 3 + code[:20], "hello world " * 10,
               "one two three four five six"]
    path = tiny_checkpoint("llama", seed=5)
    model, tok = mlx_load(str(path))
    want = [mlx_lm_greedy(model, tok.encode(p), 50, tok.eos_token_ids) for p in prompts]
    engine = _engine(path, 8)
    try:
        replies = run_all(engine, [greedy(p, 50) for p in prompts])
    finally:
        close(engine)
    assert [token_ids(r) for r in replies] == want
    tally = engine.spec_tally
    assert tally.requests == len(prompts) and tally.batch_steps > 0
    specs = [r.finish.usage.speculation for r in replies]
    assert sum(s["drafted"] - s["accepted"] for s in specs) > 0  # rollbacks happened


@pytest.mark.parametrize("batch", [8, 1])
def test_prefix_cache_entries_hold_exactly_their_tokens(batch):
    """A reply that ends inside a speculative burst publishes KV that matches its tokens:
    the same request again starts from the cache and decodes the same reply."""
    path = tiny_checkpoint("llama", seed=3)
    model, tok = mlx_load(str(path))
    want = mlx_lm_greedy(model, tok.encode(PROMPT), 50, tok.eos_token_ids)
    engine = Engine.load(str(path), progress=False, batch=batch, speculation=SpecConfig())
    try:
        first, again = (run_all(engine, [greedy(PROMPT, 50)])[0] for _ in range(2))
    finally:
        close(engine)
    assert token_ids(first) == token_ids(again) == want
    assert again.finish.usage.cached_tokens > 0
    assert first.finish.usage.speculation["accepted"] > 0


@pytest.mark.parametrize("batch", [8, 1])
def test_penalties_see_every_position_of_a_window(batch):
    """Logits processors (a repetition penalty) run at every verified position with the
    history up to it, as in mlx-lm's own loop."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors

    path = tiny_checkpoint("llama", seed=3)
    model, tok = mlx_load(str(path))
    procs = make_logits_processors(repetition_penalty=1.5, repetition_context_size=2)
    steps = generate_step(mx.array(tok.encode(PROMPT)), model, max_tokens=N,
                          logits_processors=procs)
    want = [int(t) for t, _ in steps]
    engine = _engine(path, batch)
    try:
        (reply,) = run_all(engine, [greedy(PROMPT, N, repetition_penalty=1.5,
                                           repetition_context_size=2)])
    finally:
        close(engine)
    assert token_ids(reply) == want
    spec = reply.finish.usage.speculation
    assert spec["drafted"] > spec["accepted"] > 0
