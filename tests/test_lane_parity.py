"""Requests without a seed run on the batch lane (mlx-lm's BatchGenerator): its logits
processors and logprobs must match mlx-lm's single-sequence ``generate_step`` too.

Greedy decoding makes the batch lane comparable token for token; at temperature > 0 the
reference replays the served tokens through ``generate_step`` (a sampler that returns
them), so every log-prob is checked against the distribution it was sampled from.
"""

from __future__ import annotations

import threading

import httpx
import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

from mlxbun_core.testing.checkpoints import tiny_checkpoint

PROMPT = "Once upon a time"
N = 16


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def ref(ckpt):
    return mlx_load(str(ckpt))


def served(srv, **body) -> dict:
    r = httpx.post(srv.v1 + "/completions", timeout=120, json={
        "prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": True, **body})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["lane"] == "batched"
    return out


def ids_of(out) -> list[int]:
    return [e["id"] for e in out["choices"][0]["logprobs"]["content"]]


def processors(params: dict):
    kw = dict(params)
    if "logit_bias" in kw:
        kw["logit_bias"] = {int(k): float(v) for k, v in kw["logit_bias"].items()}
    return make_logits_processors(**kw)


def reference(ref, params: dict, *, sampler=None) -> list:
    """[(token, logprobs)] from mlx-lm's generate_step (greedy unless ``sampler``)."""
    model, tok = ref
    out = []
    for t, lp in generate_step(mx.array(tok.encode(PROMPT)), model, max_tokens=N,
                               sampler=sampler, logits_processors=processors(params)):
        out.append((int(t), lp))
        if t in tok.eos_token_ids:
            break
    return out


GREEDY = {
    "repetition": {"repetition_penalty": 5.0, "repetition_context_size": 0},
    "presence": {"presence_penalty": 2.0, "presence_context_size": 8},
    "frequency": {"frequency_penalty": 1.0, "frequency_context_size": 30},
    "logit_bias": {"logit_bias": {"300": 3.0, "17": 2.5}},
}


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
def test_greedy_processors_equal_mlx_lm(srv, ref, params):
    ours = ids_of(served(srv, **params))
    assert ours == [t for t, _ in reference(ref, params)]
    assert ours != [t for t, _ in reference(ref, {})], "the processor must change the tokens"


def test_concurrent_rows_keep_their_own_processors(srv, ref):
    """Rows decoded together: each sees its own penalties and history, no other row's."""
    results = {}

    def one(name):
        results[name] = ids_of(served(srv, **GREEDY[name]))

    threads = [threading.Thread(target=one, args=(name,)) for name in GREEDY]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    for name, params in GREEDY.items():
        assert results[name] == [t for t, _ in reference(ref, params)], name


def test_unseeded_logprobs_are_the_sampled_tokens(srv, ref):
    """At temperature > 0 each entry is the sampled token with its own log-prob."""
    _, tok = ref
    # no EOS: sixteen random draws, so some are surely not the most likely token
    params = {"repetition_penalty": 1.3, "logit_bias": {str(i): -100 for i in tok.eos_token_ids}}
    entries = served(srv, temperature=1.0, **params)["choices"][0]["logprobs"]["content"]
    ids = [e["id"] for e in entries]
    replay = iter(ids)
    # generate_step samples one token ahead: past the end, any token will do
    steps = reference(ref, params, sampler=lambda lp: mx.array([next(replay, 0)]))[:len(ids)]
    assert [t for t, _ in steps] == ids
    for e, (t, lp) in zip(entries, steps):
        assert e["logprob"] == pytest.approx(lp[t].item(), abs=1e-5)
    assert any(t != int(mx.argmax(lp).item()) for t, lp in steps), "needs a non-argmax sample"
