"""Speculative decoding dispatched through the draft_source hook (built-in draft-model plugin)."""

import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import mlx_lm_greedy
from mlxbun_core.testing.server import start_server

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def srv(ckpt):
    # the target drafting for itself: every greedy proposal must be accepted
    draft = {"draft_model": str(ckpt), "num_draft_tokens": 3}
    s = start_server(ckpt, options=LoadOptions(extra=draft))
    yield s
    s.stop()


def greedy_ids(client, **extra):
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=20, temperature=0,
                                  extra_body={"logprobs": True, **extra})
    return [e["id"] for e in r.choices[0].logprobs.content], r.usage


def test_speculative_greedy_equals_mlx_lm_and_reports_usage(srv, ckpt):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    ids, usage = greedy_ids(client)
    model, tok = mlx_load(str(ckpt))
    assert ids == mlx_lm_greedy(model, tok.encode(PROMPT), 20, tok.eos_token_ids)
    assert usage.lane == "serial+spec"
    spec = usage.speculation
    assert spec["accepted"] + spec["targetCalls"] == usage.completion_tokens
    assert spec["accepted"] > 0 and spec["drafted"] >= spec["accepted"]


def test_stream_and_stats_show_the_draft(srv):
    import httpx

    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="m", max_tokens=8, stream=True,
                                                 messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].usage.lane == "serial+spec"
    stats = httpx.get(srv.base_url + "/stats").json()["speculation"]
    assert stats == {"draft": srv.engine.draft.name, "num_draft_tokens": 3}


def test_grammar_requests_decode_without_the_draft(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    r = client.completions.create(model="m", prompt="Pick:", max_tokens=10,
                                  extra_body={"guided_choice": ["left", "right"]})
    assert r.choices[0].text in ("left", "right")
    assert r.usage.lane == "serial" and getattr(r.usage, "speculation", None) is None


def test_draft_with_another_vocabulary_is_refused(ckpt):
    other = tiny_checkpoint("llama", seed=3, vocab_size=1500)
    with pytest.raises(ValueError, match="different vocabulary"):
        start_server(ckpt, options=LoadOptions(extra={"draft_model": str(other)}))
