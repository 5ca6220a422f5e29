"""MTP speculation over HTTP: a tiny Qwen3.5 checkpoint that ships an ``mtp.*`` head
drafts for itself (``--draft-kind mtp``); greedy output equals plain decoding and
mlx-lm's own, streaming and not, on a second turn that hits the prefix cache, with the
request's logits processors; a sampled request runs the same verify; a model without a
head refuses the flag at start-up and the request field with a 400.

The head is the testing builder's ``"copy"`` head (it proposes the token it was given
again, see :mod:`mlxbun_core.testing.mtp`), so the tiny model's repeated tokens are
accepted drafts: the accept path runs, not only rejections. float32 weights keep the
batched verify window and the one-token plain decode off bfloat16 knife-edges.
"""

from __future__ import annotations

import argparse

import anthropic
import httpx
import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core.cli import build_parser
from mlxbun_core.engine.speculate import SpecConfig, SpecUnavailable, server_config
from mlxbun_core.startup import StartFailed, load_engine, lookup_config
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure, mlx_lm_greedy
from mlxbun_core.testing.server import start_server

PROMPT = "hello there how are you"
MTP, PLAIN = {"draft_kind": "mtp"}, {"draft_kind": "none"}


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3_5", mtp="copy", dtype="float32")


@pytest.fixture(scope="module")
def srv(ckpt):
    """The landing gate off (``MLXBUN_SPEC_BATCH_GATE=0``): the tiny model's replies repeat
    a token now and then, which only a stream that drafts every round catches (a cold
    gate opens after two true checks in a row: tests/test_mtp_gate.py)."""
    with pytest.MonkeyPatch.context() as mp:
        configure(mp, speculation={"batch_gate": False})
        s = start_server(ckpt, speculation=server_config("mtp"))
        yield s
        s.stop()


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)


def spec_of(usage) -> dict | None:
    return (usage.model_extra or {}).get("speculation")


def ids_of(r) -> list[int]:
    return [e["id"] for e in r.choices[0].logprobs.content]


def complete(oai, body: dict, **kw):
    return oai.completions.create(model="m", prompt=PROMPT, max_tokens=40, temperature=0,
                                  extra_body={"logprobs": True, **body}, **kw)


def test_greedy_equals_plain_decoding_and_mlx_lm(srv, oai, ckpt):
    mtp, plain = complete(oai, MTP), complete(oai, PLAIN)
    model, tok = mlx_load(str(ckpt))
    assert ids_of(mtp) == ids_of(plain) == mlx_lm_greedy(model, tok.encode(PROMPT), 40,
                                                         tok.eos_token_ids)
    spec = spec_of(mtp.usage)
    assert spec is not None and spec_of(plain.usage) is None
    assert spec["accepted"] > 0 and spec["drafted"] > spec["accepted"]  # both paths ran
    # every round is one target forward; the first (the prompt's last token) drafts nothing
    assert spec["targetCalls"] + spec["accepted"] >= mtp.usage.completion_tokens
    # MTP rows decode on the batch lane where there is one (tests/test_mtp_batch.py)
    assert mtp.usage.model_extra["lane"] == ("batched+spec" if srv.engine.batch > 1
                                             else "serial+spec")


def test_server_default_per_request_depth_and_processors(oai):
    """The server's ``--draft-kind mtp`` applies unasked; ``num_draft_tokens`` sets the
    depth; a repetition penalty (a logits processor) sees every verified position."""
    penalty = {"repetition_penalty": 1.5}
    default = complete(oai, penalty)
    deep = complete(oai, {**penalty, **MTP, "num_draft_tokens": 4})
    plain = complete(oai, {**penalty, **PLAIN})
    assert ids_of(default) == ids_of(deep) == ids_of(plain)
    d, k = spec_of(default.usage), spec_of(deep.usage)
    assert d is not None and k is not None
    # every verified round drafted the asked depth (the head's own, 2, by default)
    assert k["drafted"] > 0 and k["drafted"] % 4 == 0 and d["drafted"] % 2 == 0


def test_chat_stream_and_a_second_turn_hitting_the_prefix_cache(oai):
    turn1 = [{"role": "user", "content": "Tell me about the sea"}]
    chunks = list(oai.chat.completions.create(
        model="m", messages=turn1, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=MTP))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert spec_of(chunks[-1].usage)["targetCalls"] > 0
    whole = oai.chat.completions.create(model="m", messages=turn1, max_tokens=24,
                                        temperature=0, extra_body=PLAIN)
    assert streamed == whole.choices[0].message.content
    turn2 = turn1 + [{"role": "assistant", "content": streamed},
                     {"role": "user", "content": "and the mountains?"}]
    mtp = oai.chat.completions.create(model="m", messages=turn2, max_tokens=24,
                                      temperature=0, extra_body=MTP)
    assert mtp.usage.prompt_tokens_details.cached_tokens > 0  # drafted after a cache hit
    assert spec_of(mtp.usage)["drafted"] > 0
    plain = oai.chat.completions.create(model="m", messages=turn2, max_tokens=24,
                                        temperature=0, extra_body=PLAIN)
    assert mtp.choices[0].message.content == plain.choices[0].message.content


def test_sampled_requests_run_the_verify_and_anthropic_carries_usage(srv, oai):
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=30, temperature=1.0,
                               top_p=0.9, extra_body={**MTP, "logprobs": True})
    spec = spec_of(r.usage)
    assert spec is not None and spec["drafted"] > 0
    n = r.usage.completion_tokens  # sampled: the random model may draw EOS before 30
    assert len(ids_of(r)) == n and (n == 30) == (r.choices[0].finish_reason == "length")
    assert all(lp["logprob"] <= 0 for lp in r.choices[0].logprobs.content)
    claude = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    msg = claude.messages.create(model="m", max_tokens=12,
                                 messages=[{"role": "user", "content": PROMPT}],
                                 extra_body={**MTP, "temperature": 0.7})
    assert msg.usage.model_dump()["speculation"]["targetCalls"] > 0


def test_stats_name_the_head(srv):
    stats = httpx.get(srv.base_url + "/stats").json()["speculation"]
    assert stats["mtp"] == {"head": srv.engine.predictor.name, "default": True}
    assert stats["accepted"] > 0 and stats["requests"] > 0


def test_a_model_without_a_head_refuses_the_request(srv):
    predictor, srv.engine.predictor = srv.engine.predictor, None  # as a headless model
    try:
        r = httpx.post(srv.v1 + "/completions",
                       json={"prompt": "hi", "max_tokens": 2, **MTP})
        assert r.status_code == 400 and r.json()["error"]["param"] == "draft_kind"
        assert "multi-token-prediction" in r.json()["error"]["message"]
        r = httpx.post(srv.base_url + "/v1/messages", json={
            "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            **MTP})
        assert r.status_code == 400 and r.json()["type"] == "error"
    finally:
        srv.engine.predictor = predictor
    ok = httpx.post(srv.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2, **MTP})
    assert ok.status_code == 200  # the next request is served


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_flags_and_the_start_up_error():
    assert lookup_config(_args("--draft-kind", "mtp")) == SpecConfig("mtp", 0)
    assert lookup_config(_args("--draft-kind", "mtp", "--num-draft-tokens", "3")) \
        == SpecConfig("mtp", 3)
    with pytest.raises(StartFailed):
        lookup_config(_args("--draft-kind", "mtp", "--draft-model", "x"))
    headless = tiny_checkpoint("qwen3_5", dtype="float32")
    with pytest.raises(StartFailed) as failed:
        load_engine(_args(str(headless), "--draft-kind", "mtp"), None)
    assert failed.value.args == (2,)
    with pytest.raises(SpecUnavailable, match="no multi-token-prediction head"):
        start_server(headless, speculation=server_config("mtp"))
