"""Preemption under a KV scheme (``--kv-quant 4``): rows preempted by an out-of-memory
(``MLXBUN_FAULT_ALLOC``) or by a pool out of blocks are recomputed from their prompt and
output, and what comes out equals mlx-lm's own quantized loop
(``generate_step(..., kv_bits=4, quantized_kv_start=0)``, greedy, float32 on the CPU),
uninterrupted: tokens, and log-probs within 1e-4. mlx-lm attends over a fresh cache's
first pass in full precision and over quantized keys after it, so a recomputed row must
read in its first pass exactly what its first run read there; a lone job (decoded
outside the batch) and batched rows both. The pool ends empty every time.

Batched rows start together (``run_all(..., together=True)``): which rows share a step
can change the last bits of a row's numbers, and a 4-bit group now and then rounds such a
difference to a whole step. When a loaded machine let the rows arrive over several steps,
log-probs came 2e-4 to 7e-4 off mlx-lm's in about half the runs; started together, none
in six runs on the same loaded machine."""

from __future__ import annotations

import asyncio
import sys

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.lanes.pace import FixedChunk
from mlxbun_core.engine.memory import MemoryConfig
from mlxbun_core.engine.readings import Reading
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, run_all, token_ids

BITS = 4
# head dims of 64, so that the group of 64 divides them
FAMILIES = {"llama": {"head_dim": 64},
            "qwen3_5": {"text_config": {"head_dim": 64}},
            "gemma3_text": {"head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 8,
                            "sliding_window_pattern": 2}}
PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog " * 3, "a b c",
           "x" * 40, "Once upon a time in a land far away", "1 2 3 4 5 6 7 8 9 10 11 12"]


@pytest.fixture(autouse=True)
def lenient_mlx_lm(monkeypatch):
    """mlx-lm's kv_bits loop, minus its crash on sliding windows (``RotatingKVCache``
    cannot quantize): those layers stay plain, as ours do."""
    gen = sys.modules["mlx_lm.generate"]
    original = gen.maybe_quantize_kv_cache

    def convert(cache, **kw):
        keep = [i for i, c in enumerate(cache) if not isinstance(c, RotatingKVCache)]
        part = [cache[i] for i in keep]
        original(part, **kw)
        for i, c in zip(keep, part):
            cache[i] = c

    monkeypatch.setattr(gen, "maybe_quantize_kv_cache", convert)


def checkpoint(family: str):
    return tiny_checkpoint(family, seed=3, dtype="float32", config_overrides=FAMILIES[family])


def engine(path, **memory) -> Engine:
    """A batched engine whose prompts are read whole in their first pass, as mlx-lm's
    loop reads them (its 2,048-token step), however fast the machine is right now."""
    e = Engine.load(str(path), progress=False, batch=8, prompt_cache_bytes=0,
                    kv_quant=str(BITS), memory=MemoryConfig(**memory))
    e.worker.lanes[0].pacer = FixedChunk(1 << 14)
    return e


def prompt_ids(e: Engine, bodies: list[dict]) -> list[list[int]]:
    async def go():
        return [(await e.prepare(e.parse_completion(b))).request.prompt_tokens
                for b in bodies]
    return asyncio.run(go())


def equal_to_mlx_lm(path, e: Engine, bodies: list[dict], replies: list) -> None:
    """Each reply's ``(token, logprob)`` are mlx-lm's quantized loop's, uninterrupted."""
    model = load(str(path))[0]
    for prompt, body, reply in zip(prompt_ids(e, bodies), bodies, replies, strict=True):
        want = [(int(t), lp[int(t)].item()) for t, lp in generate_step(
            mx.array(prompt), model, max_tokens=body["max_tokens"], kv_bits=BITS,
            kv_group_size=64, quantized_kv_start=0, sampler=lambda x: mx.argmax(x, axis=-1))]
        got = token_ids(reply)
        assert got == [t for t, _ in want][:len(got)]
        assert len(got) == len(want) or reply.finish.reason == "stop"
        assert [lp["logprob"] for lp in reply.finish.logprobs] == \
            pytest.approx([lp for _, lp in want][:len(got)], abs=1e-4)


def pool_empty(e: Engine) -> None:
    blocks = e.batch_stats()["kv_blocks"]
    assert blocks is None or blocks["used"] == 0, blocks


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_preempted_by_out_of_memory_equal_mlx_lms_quantized_loop(family):
    path = checkpoint(family)
    e = engine(path, fault_alloc=5)
    try:
        bodies = [greedy(p, 16) for p in PROMPTS]
        got = run_all(e, bodies, together=True)
        equal_to_mlx_lm(path, e, bodies, got)
        counts = e.memory.counts
        assert counts["out_of_memory"] >= 5 and counts["preemptions"] >= 5, counts
        assert counts["refused"] == 0 and e.batch_stats()["kv_blocks"]["kv_quant"] == "4"
        pool_empty(e)
    finally:
        close(e)


def test_a_lone_job_preempted_again_and_again_equals_mlx_lms_quantized_loop():
    """One request: it starts alone (outside the batch), every sixth step fails, it is
    recomputed in the batch and goes on alone again, over and over."""
    path = checkpoint("llama")
    e = engine(path, fault_alloc=6)
    try:
        bodies = [greedy(PROMPTS[4] * 3, 24)]
        got = run_all(e, bodies)
        equal_to_mlx_lm(path, e, bodies, got)
        assert e.memory.counts["preemptions"] >= 3, e.memory.counts
        pool_empty(e)
    finally:
        close(e)


def test_rows_preempted_for_blocks_equal_mlx_lms_quantized_loop():
    """A device of room for 750 quantized blocks (the reading is what the pool leaves
    free; the pool keeps a step's room beside it): rows that need a block as they decode
    find none; the youngest are preempted and recomputed. Short prompts and long replies:
    the prompts' first pass fits whole (a step cut to the room would read them in parts,
    unlike mlx-lm), while the blocks the replies take outgrow the pool."""
    path = checkpoint("llama")
    e = engine(path, margin_bytes=0)
    per_block = int(e.admission.layout.bytes_per_token * 16)
    room = 750 * per_block  # tried: 450-500 and 700-800 (600: no pool shortage)
    lane = e.worker.lanes[0]

    def pool_bytes() -> int:
        stats = lane.pool_stats()
        return 0 if stats is None else int(stats["bytes"])

    e.memory.probe = lambda: Reading(room - pool_bytes(), 0, "test")
    try:
        bodies = [greedy(" ".join(str((i * 7 + j) % 50) for j in range(6 + 3 * i)), 320)
                  for i in range(6)]
        got = run_all(e, bodies, together=True)
        equal_to_mlx_lm(path, e, bodies, got)
        counts = e.memory.counts
        assert counts["out_of_blocks"] >= 1 and counts["preemptions"] >= 1, counts
        blocks = e.batch_stats()["kv_blocks"]
        assert blocks["bytes"] + e.memory.step["reserve_bytes"] <= room, blocks
        pool_empty(e)
    finally:
        close(e)
