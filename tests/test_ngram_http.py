"""Prompt-lookup speculation over HTTP: the per-request ``draft_kind`` field on every
surface (official OpenAI and Anthropic SDKs), ``usage.speculation`` in each one's usage
block (streaming too), clear 400s for bad values, the server default (``--draft-kind
ngram``) and its counters in /stats and /metrics."""

from __future__ import annotations

import argparse

import anthropic
import httpx
import openai
import pytest

from mlxbun_core.cli import build_parser
from mlxbun_core.engine.speculate import SpecConfig
from mlxbun_core.startup import StartFailed, lookup_config
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

BLOCK = "alpha beta gamma delta 12 34 56 epsilon zeta eta theta iota kappa lambda mu "
PROMPT = BLOCK * 3 + BLOCK[:40]
NGRAM = {"draft_kind": "ngram"}


@pytest.fixture(scope="module")
def srv():
    s = start_server(tiny_checkpoint("llama", seed=3), prompt_cache_bytes=0)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)


def spec_of(usage) -> dict | None:
    extra = usage.model_extra or {}
    return extra.get("speculation")


def test_completions_opt_in_and_out(oai):
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=40, temperature=0,
                               extra_body=NGRAM)
    spec = spec_of(r.usage)
    assert spec is not None and spec["accepted"] > 0 and spec["drafted"] >= spec["accepted"]
    plain = oai.completions.create(model="m", prompt=PROMPT, max_tokens=40, temperature=0)
    assert spec_of(plain.usage) is None
    assert plain.choices[0].text == r.choices[0].text  # greedy: the same reply


def test_chat_stream_reports_speculation_in_the_final_chunk(oai):
    chunks = list(oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=30,
        temperature=0, stream=True, extra_body={**NGRAM, "num_draft_tokens": 4}))
    spec = spec_of(chunks[-1].usage)
    assert spec is not None and spec["targetCalls"] > 0


def test_messages_and_responses_carry_it(srv, oai):
    claude = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    msg = claude.messages.create(model="m", max_tokens=30,
                                 messages=[{"role": "user", "content": PROMPT}],
                                 extra_body={**NGRAM, "temperature": 0})
    assert msg.usage.model_dump()["speculation"]["targetCalls"] > 0
    resp = oai.responses.create(model="m", input=PROMPT, max_output_tokens=30,
                                temperature=0, extra_body=NGRAM)
    assert spec_of(resp.usage)["targetCalls"] > 0


@pytest.mark.parametrize("body, param", [
    ({"draft_kind": "eagle"}, "draft_kind"),
    ({"draft_kind": 3}, "draft_kind"),
    ({"draft_kind": "ngram", "num_draft_tokens": 0}, "num_draft_tokens"),
    ({"num_draft_tokens": True}, "num_draft_tokens"),
])
def test_bad_values_are_400s_naming_the_field(srv, body, param):
    r = httpx.post(srv.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    r = httpx.post(srv.base_url + "/v1/messages", json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert httpx.post(srv.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2}) \
        .status_code == 200  # the next request is served


def test_server_default_request_override_and_counters(srv, oai):
    before = httpx.get(srv.base_url + "/stats").json()["speculation"]
    srv.engine.speculation = SpecConfig()  # as --draft-kind ngram would set it
    try:
        on = oai.completions.create(model="m", prompt=PROMPT, max_tokens=30, temperature=0)
        off = oai.completions.create(model="m", prompt=PROMPT, max_tokens=30, temperature=0,
                                     extra_body={"draft_kind": "none"})
        stats = httpx.get(srv.base_url + "/stats").json()["speculation"]
    finally:
        srv.engine.speculation = None
    spec = spec_of(on.usage)
    assert spec is not None and spec_of(off.usage) is None
    assert stats["ngram"]["num_draft_tokens"] == 10
    assert stats["requests"] == before["requests"] + 1
    assert stats["accepted"] == before["accepted"] + spec["accepted"]
    metrics = httpx.get(srv.base_url + "/metrics").text
    line = next(x for x in metrics.splitlines()
                if x.startswith("mlxbun_speculation_accepted_total"))
    assert float(line.split()[-1]) == stats["accepted"]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_flags():
    assert lookup_config(_args()) is None
    cfg = lookup_config(_args("--draft-kind", "ngram", "--ngram-max", "4"))
    assert cfg == SpecConfig(num_draft_tokens=10, ngram_max=4)
    assert lookup_config(_args("--draft-kind", "ngram", "--num-draft-tokens", "5")) \
        .num_draft_tokens == 5
    for bad in (("--draft-kind", "ngram", "--draft-model", "x"),
                ("--draft-kind", "ngram", "--ngram-min", "4", "--ngram-max", "2")):
        with pytest.raises(StartFailed):
            lookup_config(_args(*bad))
