"""A request that names no ``max_tokens`` stops at the server's default cap (4096; a
looping model used to run to the end of its window), shown in ``/v1/models``; a request's
own ``max_tokens`` is unaffected, and ``--max-tokens 0`` turns the cap off. Real
``mlxbun serve`` processes (the default lives in ``serve``'s flags), the openai SDK."""

from __future__ import annotations

import json

import httpx
import openai
from mlx_lm.utils import load_tokenizer

from mlxbun_core.testing import process
from mlxbun_core.testing.checkpoints import tiny_checkpoint

DEFAULT_CAP = 4096


def serve(ckpt, *flags):
    proc = process.serve(ckpt, "--no-open", *flags, timeout=120)
    return proc, proc.base


def never_ending(ckpt) -> dict:
    """A logit bias that keeps the random model from ever choosing an end token (a loop):
    the tokenizer's and generation_config.json's, as the engine stops on both."""
    ends = set(load_tokenizer(ckpt).eos_token_ids)
    config = json.loads((ckpt / "generation_config.json").read_text())
    ends |= set(config.get("eos_token_id") or [])
    return {str(t): -100 for t in ends}


def test_requests_without_max_tokens_stop_at_the_default_cap():
    ckpt = tiny_checkpoint("llama", seed=9, config_overrides={"max_position_embeddings": 12288})
    proc, base = serve(ckpt)
    with proc:
        row = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]
        assert row["gen_defaults"]["max_tokens"] == DEFAULT_CAP
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=600)
        kw = dict(model="m", prompt="Once upon a time", temperature=1.0, seed=1,
                  logit_bias=never_ending(ckpt))
        r = client.completions.create(**kw)
        assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", DEFAULT_CAP)
        # a request's own max_tokens is its own (above a default cap too: test_config's
        # model entry of 1 and a request of 2)
        assert client.completions.create(max_tokens=7, **kw).usage.completion_tokens == 7


def test_max_tokens_0_turns_the_cap_off():
    """Without a cap the model runs to the end of its window (here 300 tokens)."""
    ckpt = tiny_checkpoint("llama", seed=9, config_overrides={"max_position_embeddings": 300})
    proc, base = serve(ckpt, "--max-tokens", "0")
    with proc:
        assert httpx.get(base + "/v1/models", timeout=30).json()["data"][0][
            "gen_defaults"]["max_tokens"] is None
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=600)
        r = client.completions.create(model="m", prompt="Once upon a time", temperature=1.0,
                                      seed=1, logit_bias=never_ending(ckpt))
        assert r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 300
