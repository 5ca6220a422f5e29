"""OpenAI's wire shapes, read through the official SDK's typed objects on a real server:
logprobs (chat's per-token shape, streamed too; completions' legacy block), ``n`` choices,
``models.retrieve``, 405 with ``Allow``, and validation messages in words."""

from __future__ import annotations

import httpx
import openai
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint

ASK = [{"role": "user", "content": "Tell me about the sea."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


def chat(client, **kw):
    return client.chat.completions.create(model="m", messages=ASK, **{"max_tokens": 8, **kw})


def fields(entry) -> tuple:
    return entry.id, entry.token, entry.logprob, entry.bytes


# -- logprobs ----------------------------------------------------------------------

def test_chat_logprobs_entries_carry_text_and_bytes(client, srv):
    r = chat(client, temperature=0, logprobs=True)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    tok = srv.engine.model.tokenizer
    for e in entries:
        assert isinstance(e.token, str) and e.bytes == list(bytes(e.bytes))
        assert e.top_logprobs == [] and e.logprob <= 0
        if "\ufffd" not in e.token:
            assert e.bytes == list(e.token.encode()) and e.token == tok.decode([e.id])
    raw = b"".join(bytes(e.bytes) for e in entries if e.id not in tok.eos_token_ids)
    text = raw.decode("utf-8", "replace")  # a reply cut by max_tokens can end mid-character
    assert text.lstrip(" ") == r.choices[0].message.content


def test_top_logprobs_have_text_and_bytes_and_follow_the_sampled_token(client):
    r = chat(client, temperature=1.0, seed=3, logprobs=True, top_logprobs=3, max_tokens=12)
    entries = r.choices[0].logprobs.content
    for e in entries:
        assert len(e.top_logprobs) == 3
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True) and e.logprob <= values[0]
        for t in e.top_logprobs:
            assert isinstance(t.token, str) and isinstance(t.bytes, list)
            assert t.bytes and bytes(t.bytes).decode("utf-8", "replace") == t.token
    # sampled at temperature 1: some token is not the most likely one, and is reported
    assert any(e.id != e.top_logprobs[0].id for e in entries)


def test_streamed_chat_logprobs_equal_the_whole_reply(client):
    kw = dict(temperature=0, logprobs=True, top_logprobs=2, max_tokens=10)
    whole = chat(client, **kw).choices[0].logprobs.content
    chunks = list(chat(client, stream=True, **kw))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [fields(e) for e in streamed] == [fields(e) for e in whole]
    assert [[fields(t) for t in e.top_logprobs] for e in streamed] == \
        [[fields(t) for t in e.top_logprobs] for e in whole]


def test_completions_logprobs_legacy_shape_streamed_too(client):
    kw = dict(model="m", prompt="Once upon a time", max_tokens=8, temperature=0,
              extra_body={"logprobs": True, "top_logprobs": 2})
    lp = client.completions.create(**kw).choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs)
    assert all(len(d) <= 2 and max(d.values()) >= v for d, v in zip(lp.top_logprobs,
                                                                    lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    chunks = list(client.completions.create(stream=True, **kw))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [t for b in streamed for t in b.tokens] == lp.tokens
    assert [v for b in streamed for v in b.token_logprobs] == lp.token_logprobs
    assert [o for b in streamed for o in b.text_offset] == lp.text_offset


# -- models.retrieve ---------------------------------------------------------------

def test_models_retrieve_answers_the_model_object(client, srv):
    served = srv.engine.model.id
    m = client.models.retrieve(served)
    assert m.id == served and m.object == "model" and m.owned_by == "mlxbun"
    listed = client.models.list().data[0]
    assert m.model_dump() == listed.model_dump()  # every field of its row, extras too
    assert m.capabilities["logprobs"] is True
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["code"] == "model_not_found" and "no-such-model" in err.value.message


# -- n ------------------------------------------------------------------------------

def test_n_choices_with_a_seed(client):
    kw = dict(temperature=1.0, seed=11, logprobs=True)
    r = chat(client, n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) == 3  # each choice samples with its own seed (seed + index)
    assert texts[0] == chat(client, **kw).choices[0].message.content
    assert texts[1] == chat(client, **{**kw, "seed": 12}).choices[0].message.content
    assert chat(client, n=3, **kw).model_dump()["choices"] == r.model_dump()["choices"]
    single = chat(client, **kw)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counted once
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)


def test_n_choices_stream(client):
    kw = dict(temperature=1.0, seed=4, n=2)
    whole = chat(client, **kw)
    chunks = list(chat(client, stream=True, **kw))
    text = {0: "", 1: ""}
    finishes = {}
    for c in chunks[:-1]:
        (choice,) = c.choices
        text[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert text == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_n_choices_each_keep_their_own_grammar(client):
    """A forced tool call constrains every choice with a grammar of its own."""
    r = chat(client, n=2, tools=[WEATHER], tool_choice="required", temperature=1.0,
             max_tokens=300, parallel_tool_calls=False)
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == \
            "get_weather"


def test_n_on_completions(client):
    r = client.completions.create(model="m", prompt="Once", max_tokens=4, n=2, temperature=0)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text == r.choices[1].text


@pytest.mark.parametrize("n,message", [
    (0, "n must be at least 1"), (-1, "n must be at least 1"), (17, "n must be at most 16"),
    ("2", "n must be an integer (got the string '2')"), (True, "n must be an integer")])
def test_bad_n_is_a_400(srv, n, message):
    for path, body in (("/chat/completions", {"messages": ASK}), ("/completions", {"prompt": "x"})):
        r = httpx.post(srv.v1 + path, json={**body, "n": n}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(message)
        assert r.json()["error"]["param"] == "n"


# -- 405 and validation messages -----------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                  "/v1/embeddings", "/v1/messages", "/v1/messages/count_tokens"])
def test_post_only_routes_answer_405_with_allow(srv, path):
    r = httpx.get(srv.base_url + path)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["code"] == "method_not_allowed"
    assert "GET" in (body["error"]["message"])


def test_405_names_every_allowed_method_and_404_stays(srv):
    r = httpx.post(srv.v1 + "/responses/resp_x", json={})
    assert r.status_code == 405 and r.headers["allow"] == "GET, DELETE"
    assert httpx.post(srv.v1 + "/models", json={}).headers["allow"] == "GET"
    assert httpx.get(srv.v1 + "/nothing-here").status_code == 404


@pytest.mark.parametrize("body,message,param", [
    ({"messages": "hi"}, "messages must be an array of message objects (got the string 'hi')",
     "messages"),
    ({"temperature": "hot"}, "temperature must be of type ('float', 'int')",
     "temperature"),
    ({"top_p": [1]}, "top_p must be of type ('float', 'int')", "top_p"),
    ({"top_k": 1.5}, "top_k must be of type int", "top_k"),
    ({"max_tokens": "8"}, "max_tokens must be of type int", "max_tokens"),
    ({"logprobs": "yes"}, "logprobs must be of type bool", "logprobs"),
    ({"logit_bias": [1]}, "logit_bias must be of type dict",
     "logit_bias"),
    ({"messages": [{"role": "wizard", "content": "hi"}]},
     "messages[0].role must be one of 'system', 'developer', 'user', 'assistant', 'tool', "
     "'function' (got 'wizard')", "messages[0].role"),
    ({"messages": [{"role": "user", "content": "a"}, {"content": "b"}]},
     "messages[1].role is required", "messages[1].role"),
    ({"messages": [{"role": "user", "content": 5}]},
     "messages[0].content must be a string or an array of parts (got 5)", "messages"),
])
def test_validation_messages_name_the_field_and_type_in_words(srv, body, message, param):
    r = httpx.post(srv.v1 + "/chat/completions", json={"messages": ASK, **body}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == message and err["param"] == param


def test_every_openai_role_is_accepted(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Hi."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "function", "name": "get_weather", "content": "sunny"},
            {"role": "user", "content": "Thanks."}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", {"max_tokens": 8, "messages": ASK, "temperature": "hot"}),
    ("/v1/responses", {"input": "hi", "temperature": "hot"}),
])
def test_other_surfaces_read_well_too(srv, path, body):
    r = httpx.post(srv.base_url + path, json=body, timeout=30)
    assert r.status_code == 400
    assert "temperature must be of type ('float', 'int')" in r.json()["error"]["message"]
