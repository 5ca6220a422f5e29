"""Prefill buckets (``MLXBUN_PREFILL_BUCKETS``): with them on, every prefill forward runs
at a power-of-two query length (only known shapes on CUDA), the KV holds the same
tokens, and greedy replies equal the unsplit prefill's; ``auto`` keeps them off on CPU
so ``--batch 1`` stays bit-exact with mlx-lm."""

from __future__ import annotations

import asyncio

import pytest

from mlxbun_core.engine import prefill_shapes
from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.lanes.pace import FixedChunk
from mlxbun_core.engine.reply import gather
from mlxbun_core.runconfig import from_environ
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure

HISTORY = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(12))


def test_pieces_are_powers_of_two_summing_to_the_chunk(monkeypatch):
    configure(monkeypatch, engine={"prefill_buckets": "on"})
    for n in (1, 2, 3, 37, 64, 1000, 2047):
        parts = prefill_shapes.pieces(n)
        assert sum(parts) == n and parts == sorted(parts, reverse=True)
        assert all(p & (p - 1) == 0 for p in parts)
    configure(monkeypatch, engine={"prefill_buckets": "off"})
    assert prefill_shapes.pieces(37) == [37]
    configure(monkeypatch, engine={"prefill_buckets": "auto"})  # CPU: off
    assert not prefill_shapes.enabled() and prefill_shapes.pieces(37) == [37]
    with pytest.raises(ValueError, match="MLXBUN_PREFILL_BUCKETS"):
        from_environ({"MLXBUN_PREFILL_BUCKETS": "sometimes"})


@pytest.fixture(scope="module", params=[1, 8], ids=["serial", "solo"])
def engine(request):
    # float32: chunking changes rounding only at the 1e-7 level, so no greedy near-tie flips
    ckpt = tiny_checkpoint("llama", seed=4, dtype="float32")
    eng = Engine.load(str(ckpt), progress=False, batch=request.param, prompt_cache_bytes=0)
    for lane in eng.worker.lanes:
        lane.pacer = FixedChunk(100)  # chunks of 100: tails of odd lengths
        if hasattr(lane, "solo_prefill"):
            lane.solo_prefill = 100
    yield eng
    eng.worker.close()


def complete(eng: Engine) -> tuple[str, int]:
    async def go():
        gen = await eng.start(eng.parse_completion(
            {"prompt": HISTORY, "max_tokens": 24, "temperature": 0}))
        return gather([ev async for ev in gen.events()])

    reply = asyncio.run(go())
    return reply.content, reply.finish.usage.completion_tokens


def test_bucketed_prefill_runs_known_lengths_and_keeps_the_reply(engine, monkeypatch):
    configure(monkeypatch, engine={"prefill_buckets": "off"})
    plain = complete(engine)
    lengths: list[int] = []
    run = prefill_shapes.prefill

    def spy(model, tokens, cache, embeddings=None):
        lengths.extend(prefill_shapes.pieces(len(tokens)))
        return run(model, tokens, cache, embeddings)

    monkeypatch.setattr(prefill_shapes, "prefill", spy)
    configure(monkeypatch, engine={"prefill_buckets": "on"})
    assert complete(engine) == plain
    assert lengths and all(n & (n - 1) == 0 for n in lengths)
    assert any(n < 100 for n in lengths[:-1]) or len(lengths) > 2  # a tail really was split
