"""Speculation under a KV scheme (``--kv-quant``) on the batch lane: prompt lookup's
drafts ride the batch's windows over quantized blocks, and requests asking for the MTP
head decode plainly, batched with the rest (the head's loops run the model unwrapped,
so they never quantize). Every reply equals mlx-lm's ``kv_bits`` loop alone."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.speculate import SpecConfig, server_config
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, run_all, token_ids

PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog and then", "Hi"]
HEAD64 = {"head_dim": 64}  # so that mlx-lm's group of 64 quantizes the attention layers


def reference(path: str, prompts: list[str], n: int) -> list[tuple[list, list]]:
    """Tokens and chosen-token log-probs of mlx-lm's greedy ``kv_bits=8`` loop."""
    model, tok = mlx_load(path)
    out = []
    for p in prompts:
        ids, lps = [], []
        for t, lp in generate_step(mx.array(tok.encode(p)), model, max_tokens=n, kv_bits=8,
                                   quantized_kv_start=0):
            ids.append(int(t))
            lps.append(lp[int(t)].item())
            if int(t) in tok.eos_token_ids:
                break
        out.append((ids, lps))
    return out


def assert_same(reply, want: tuple[list, list]) -> None:
    assert token_ids(reply) == want[0]
    assert [e["logprob"] for e in reply.finish.logprobs] == pytest.approx(want[1], abs=1e-5)


def test_prompt_lookup_drafts_over_quantized_blocks():
    """Three rows decode together with prompt lookup: drafts are kept and rejected in the
    batch's windows over quantized blocks, and every row is mlx-lm's quantized loop."""
    path = str(tiny_checkpoint("llama", seed=0, config_overrides=HEAD64))
    n = 40  # long enough for the tiny model to fall into repeats that drafts catch
    engine = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0, kv_quant="8",
                         speculation=SpecConfig())
    try:
        replies = run_all(engine, [greedy(p, n) for p in PROMPTS])
    finally:
        close(engine)
    for reply, want in zip(replies, reference(path, PROMPTS, n)):
        assert reply.finish.usage.lane == "batched"
        assert_same(reply, want)
    spec = [r.finish.usage.speculation for r in replies]
    assert sum(s["drafted"] for s in spec) > sum(s["accepted"] for s in spec) > 0


def test_mtp_requests_decode_plainly_in_the_batch():
    """With the MTP head as the server's default, requests under a scheme run on the batch
    lane like any other, with no speculation, as mlx-lm's quantized loop."""
    path = str(tiny_checkpoint("qwen3_5", mtp="copy", dtype="float32",
                               config_overrides={"text_config": HEAD64}))
    engine = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0, kv_quant="8",
                         speculation=server_config("mtp"))
    try:
        replies = run_all(engine, [greedy(p, 16, draft_kind="mtp") for p in PROMPTS[:2]])
    finally:
        close(engine)
    for reply, want in zip(replies, reference(path, PROMPTS[:2], 16)):
        assert reply.finish.usage.lane == "batched"
        assert reply.finish.usage.speculation is None
        assert_same(reply, want)
