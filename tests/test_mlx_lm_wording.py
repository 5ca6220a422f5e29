"""A body field mlx_lm.server checks, sent with the wrong type, is a 400 in our error shape
whose message is mlx-lm's own: each expected message is what mlx_lm.server's
``validate_model_parameters`` raises for the same value, run here."""

from __future__ import annotations

import types

import anthropic
import httpx
import pytest
from mlx_lm.server import APIHandler

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

# a body mlx_lm.server validates cleanly, by its attribute names
VALID = {"stream": False, "max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
         "min_p": 0.0, "num_draft_tokens": 3, "repetition_penalty": 1.0,
         "repetition_context_size": 20, "presence_penalty": 0.0, "presence_context_size": 20,
         "frequency_penalty": 0.0, "frequency_context_size": 20, "logprobs": False,
         "top_logprobs": -1, "xtc_probability": 0.0, "xtc_threshold": 0.0,
         "requested_model": "m", "adapter": None, "seed": None, "logit_bias": None}
# every field it checks for type, and a value of the wrong one
WRONG = {name: "x" for name in VALID}
WRONG.update(requested_model=5, adapter=5, logit_bias=[1])
BODY_NAME = {"requested_model": "model"}  # what a body calls mlx-lm's attribute


def mlx_lm_says(name: str, value: object) -> str:
    """mlx_lm.server's message for its attribute ``name`` set to ``value``."""
    handler = types.SimpleNamespace(**{**VALID, name: value})
    handler._validate = lambda *a, **kw: APIHandler._validate(handler, *a, **kw)
    with pytest.raises(ValueError) as raised:
        APIHandler.validate_model_parameters(handler)
    return str(raised.value).replace(name, BODY_NAME.get(name, name))


@pytest.fixture(scope="module")
def srv():
    s = start_server(tiny_checkpoint("qwen3"))
    yield s
    s.stop()


@pytest.mark.parametrize("name", list(WRONG))
def test_each_field_of_the_wrong_type_reads_as_mlx_lm_says(srv, name):
    field = BODY_NAME.get(name, name)
    r = httpx.post(srv.v1 + "/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
        field: WRONG[name]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == mlx_lm_says(name, WRONG[name])
    assert err["type"] == "invalid_request_error" and err["param"] == field


def test_the_words_hold_on_the_other_surfaces(srv):
    r = httpx.post(srv.v1 + "/responses", json={"input": "hi", "stream": "yes"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "stream must be of type bool"
    r = httpx.post(srv.v1 + "/completions", json={"prompt": "hi", "max_tokens": "8"})
    assert r.status_code == 400 and r.json()["error"]["message"] == mlx_lm_says("max_tokens", "8")
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x")
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=1, extra_body={"temperature": "hot"},
                               messages=[{"role": "user", "content": "hi"}])
    assert bad.value.body["type"] == "error"
    assert bad.value.body["error"]["message"] == "temperature must be of type ('float', 'int')"
