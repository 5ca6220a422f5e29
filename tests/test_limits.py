"""Every documented request limit, exactly at the limit (served) and just past it (a 400).

Values at the limit run with temperature > 0 and the feature switched on, so the sampler
kernels really execute them: a bound looser than the kernel's is a 500 mid-request.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

CTX = 64  # a small context window, so a prompt can fill it
V = 1024  # the tiny checkpoint's vocabulary
I32 = 2**31 - 1
EPS = 1e-6


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3, config_overrides={"max_position_embeddings": CTX,
                                                              "rope_scaling": None})


@pytest.fixture(scope="module")
def srv(ckpt):
    s = start_server(ckpt)
    assert httpx.get(s.v1 + "/models").json()["data"][0]["context_window"] == CTX
    # the documented ceiling (/stats): the window, as memory is no tighter here
    assert httpx.get(s.base_url + "/stats").json()["admission"]["max_safe_context"] == CTX
    yield s
    s.stop()


def complete(srv, **body):
    body = {"prompt": "Once", "max_tokens": 2, "temperature": 1.0, "seed": 1, **body}
    return httpx.post(srv.v1 + "/completions", json=body, timeout=60)


def ok(srv, **body) -> dict:
    r = complete(srv, **body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] >= 1
    return out


def rejected(srv, message, **body):
    r = complete(srv, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"].startswith(message), err
    return err


# (request fields at the limit, the same field just past it, the message)
ON = {"xtc_probability": 1.0}  # XTC only runs its kernel with a probability
LIMITS = [
    ({"temperature": 0}, {"temperature": -EPS}, "temperature must be at least 0"),
    ({"top_p": 0}, {"top_p": -EPS}, "top_p must be at least 0"),
    ({"top_p": 1}, {"top_p": 1 + EPS}, "top_p must be at most 1"),
    ({"top_k": 0}, {"top_k": -1}, "top_k must be at least 0"),
    ({"top_k": 1}, {"top_k": -1}, "top_k must be at least 0"),
    ({"top_k": V - 1}, {"top_k": V}, f"top_k must be less than the vocabulary size ({V})"),
    ({"top_k": V - 1}, {"top_k": I32 + 1}, f"top_k must be at most {I32}"),
    ({"min_p": 0}, {"min_p": -EPS}, "min_p must be at least 0"),
    ({"min_p": 1}, {"min_p": 1 + EPS}, "min_p must be at most 1"),
    ({"xtc_probability": 0}, {"xtc_probability": -EPS}, "xtc_probability must be at least 0"),
    ({"xtc_probability": 1}, {"xtc_probability": 1 + EPS}, "xtc_probability must be at most 1"),
    ({**ON, "xtc_threshold": 0}, {**ON, "xtc_threshold": -EPS}, "xtc_threshold must be at least 0"),
    ({**ON, "xtc_threshold": 0.5}, {**ON, "xtc_threshold": 0.5 + EPS},
     "xtc_threshold must be at most 0.5"),
    ({"repetition_penalty": 0}, {"repetition_penalty": -EPS},
     "repetition_penalty must be at least 0"),
    ({"top_logprobs": -1}, {"top_logprobs": -2}, "top_logprobs must be at least 0"),
    ({"top_logprobs": 0}, {"top_logprobs": -2}, "top_logprobs must be at least 0"),
    ({"top_logprobs": 11}, {"top_logprobs": 12}, "top_logprobs must be at most 11"),
    ({"seed": 0}, {"seed": -1}, "seed must be at least 0"),
    ({"seed": 2**64 - 1}, {"seed": 2**64}, f"seed must be at most {2**64 - 1}"),
    ({"max_tokens": 1}, {"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"max_completion_tokens": 1}, {"max_completion_tokens": 0},
     "max_completion_tokens must be at least 1"),
    ({"logit_bias": {str(V - 1): 5}}, {"logit_bias": {str(V): 5}},
     f"logit_bias token id {V} is outside the vocabulary (0..{V - 1})"),
    ({"logit_bias": {"0": 5}}, {"logit_bias": {"-1": 5}}, "logit_bias token id -1 is outside"),
]
for kind in ("repetition", "presence", "frequency"):
    pen = {f"{kind}_penalty": 1.5}
    name = f"{kind}_context_size"
    LIMITS += [({**pen, name: 0}, {**pen, name: -1}, f"{name} must be at least 0"),
               ({**pen, name: I32}, {**pen, name: I32 + 1}, f"{name} must be at most {I32}")]


@pytest.mark.parametrize("at,past,message", LIMITS,
                         ids=[",".join(f"{k}={v}" for k, v in p.items()) for _, p, _ in LIMITS])
def test_limit_is_served_and_one_past_is_400(srv, at, past, message):
    ok(srv, **at)
    err = rejected(srv, message, **past)
    assert err["param"] == message.split()[0]


def test_limits_hold_on_chat_too(srv):
    msgs = [{"role": "user", "content": "hi"}]
    for body, status in (({"top_k": V - 1}, 200), ({"top_k": V}, 400),
                         ({"logit_bias": {str(V): 1}}, 400), ({"max_tokens": 0}, 400)):
        r = httpx.post(srv.v1 + "/chat/completions", timeout=60, json={
            "messages": msgs, "max_tokens": 2, "temperature": 1.0, **body})
        assert r.status_code == status, (body, r.text)


def test_limits_on_anthropic_in_its_error_shape(srv):
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    reply = client.messages.create(model="m", max_tokens=1, messages=msgs,
                                   extra_body={"top_k": V - 1, "temperature": 1.0})
    assert reply.usage.output_tokens == 1
    for extra in ({"top_k": V}, {"max_tokens": 0}, {"xtc_threshold": 0.6, "xtc_probability": 1.0}):
        r = httpx.post(srv.v1 + "/messages", timeout=60, json={
            "messages": msgs, "max_tokens": 2, "temperature": 1.0, **extra})
        assert r.status_code == 400 and r.json()["type"] == "error", (extra, r.text)


def test_logit_bias_on_the_last_id_steers_to_it(srv):
    out = ok(srv, max_tokens=3, logprobs=True, logit_bias={str(V - 1): 100})
    assert [e["id"] for e in out["choices"][0]["logprobs"]["content"]] == [V - 1] * 3


def test_top_logprobs_limit_lists_eleven(srv):
    out = ok(srv, top_logprobs=11)
    for entry in out["choices"][0]["logprobs"]["content"]:
        assert len(entry["top_logprobs"]) == 11


def test_max_tokens_one_is_one_token(srv):
    out = ok(srv, max_tokens=1, logit_bias={"1": -100})  # no EOS: the limit ends it
    assert out["usage"]["completion_tokens"] == 1 and out["choices"][0]["finish_reason"] == "length"


def prompt_of(ckpt, n: int) -> str:
    """A completion prompt that encodes to exactly ``n`` tokens (BOS included)."""
    tok = load_tokenizer(ckpt)
    text = "a " * (n - 2)
    assert len(tok.encode(text)) == n
    return text


def test_prompt_one_short_of_the_context_gets_one_token(srv, ckpt):
    out = ok(srv, prompt=prompt_of(ckpt, CTX - 1), max_tokens=50, logit_bias={"1": -100})
    assert out["usage"]["prompt_tokens"] == CTX - 1
    assert out["usage"]["completion_tokens"] == 1 and out["choices"][0]["finish_reason"] == "length"


def test_prompt_filling_the_context_is_400(srv, ckpt):
    r = complete(srv, prompt=prompt_of(ckpt, CTX))
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("memory_admission", "context_over_budget")
    assert f"prompt has {CTX} tokens" in err["message"]
