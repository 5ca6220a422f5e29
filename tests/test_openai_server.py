"""The OpenAI surfaces against a real server on loopback, driven by the openai SDK."""

import json
import threading
import time

import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import prepare_chat
from mlxbun_core.testing.helpers import configure, mlx_lm_greedy, stderr_records
from mlxbun_core.testing.server import start_server

MSG = [{"role": "user", "content": "Write a short story about a robot."}]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


def post(srv, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    return httpx.post(srv.base_url + path, content=data, timeout=60, headers=headers, **kw)


def test_chat_non_stream_shape(client, srv):
    r = client.chat.completions.create(model="anything", messages=MSG, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == srv.engine.model.id
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_stream_grammar_matches_non_stream(client):
    kw = dict(model="m", messages=MSG, max_tokens=12, temperature=0)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content == ""
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content


def test_stream_ends_with_done(srv):
    with httpx.stream("POST", srv.v1 + "/chat/completions", timeout=60,
                      json={"messages": MSG, "max_tokens": 3, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert last["choices"][0]["finish_reason"] and last["usage"]["lane"] == "batched"


def test_completions_stream_and_not(client):
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("length", "stop")
    s = list(client.completions.create(model="m", prompt="Once upon a time", max_tokens=6,
                                       temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text
    assert s[-1].usage.completion_tokens == r.usage.completion_tokens


def test_greedy_parity_with_mlx_lm(client, ckpt, srv):
    """Our engine's greedy token ids equal mlx-lm's on the same checkpoint and prompt."""
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=16,
                                  temperature=0, extra_body={"logprobs": True})
    ours = [e["id"] for e in r.choices[0].logprobs.content]
    model, tok = mlx_load(str(ckpt))
    theirs = mlx_lm_greedy(model, tok.encode("Once upon a time"), 16, tok.eos_token_ids)
    assert ours == theirs[: len(ours)] and len(ours) == len(theirs)


def test_logprobs_match_mlx_lm_distribution(client, ckpt):
    r = client.completions.create(model="m", prompt="Hello", max_tokens=3, temperature=0,
                                  extra_body={"top_logprobs": 3})
    entries = r.choices[0].logprobs.content
    model, tok = mlx_load(str(ckpt))
    logits = model(mx.array(tok.encode("Hello"))[None])[0, -1]
    lp = logits - mx.logsumexp(logits)
    first = entries[0]
    assert first["id"] == int(mx.argmax(lp).item())
    assert abs(first["logprob"] - lp[first["id"]].item()) < 1e-4
    assert [t["logprob"] for t in first["top_logprobs"]] == sorted(
        [t["logprob"] for t in first["top_logprobs"]], reverse=True)
    assert len(first["top_logprobs"]) == 3 and first["top_logprobs"][0]["id"] == first["id"]


def test_stop_sequence_cuts_output(client):
    base = client.completions.create(model="m", prompt="Once upon a time", max_tokens=20,
                                     temperature=0)
    text = base.choices[0].text
    assert len(text) > 4
    stop = text[2:4]
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=20,
                                  temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text and text.startswith(r.choices[0].text)


def test_seed_makes_sampling_repeatable(client):
    kw = dict(model="m", prompt="Once", max_tokens=10, temperature=1.0, top_p=0.9)
    a = client.completions.create(seed=7, **kw).choices[0].text
    b = client.completions.create(seed=7, **kw).choices[0].text
    assert a == b


def test_models_index_health(client, srv):
    models = client.models.list()
    assert models.data[0].id == srv.engine.model.id
    assert models.data[0].owned_by == "mlxbun"
    one = httpx.get(f"{srv.v1}/models/{srv.engine.model.id}").json()
    assert one["id"] == srv.engine.model.id and one["object"] == "model"
    assert httpx.get(f"{srv.v1}/models/nope").status_code == 404
    assert httpx.get(srv.base_url + "/health").json() == {"status": "ok"}
    idx = httpx.get(srv.v1).json()
    assert idx["name"] == "mlxbun" and "POST /v1/chat/completions" in idx["endpoints"]
    stats = httpx.get(srv.base_url + "/stats").json()
    assert stats["server"]["model"] == srv.engine.model.id


@pytest.mark.parametrize("path,body,message", [
    ("/v1/chat/completions", b"{not json", "invalid JSON body"),
    ("/v1/chat/completions", {"messages": []}, "messages required"),
    ("/v1/chat/completions", {"messages": MSG, "logit_bias": {"a": 1}},
     "logit_bias must be a dict of int to float"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": 1},
     "logprobs must be of type bool"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": "3"},
     "top_logprobs must be of type int"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": -2},
     "top_logprobs must be at least 0"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 12},
     "top_logprobs must be at most 11"),
    ("/v1/chat/completions", {"messages": MSG, "reasoning_effort": "huge"},
     "reasoning_effort must be one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh'"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": -1},
     "temperature must be at least 0"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 0}, "max_tokens must be at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     "model has no vision sidecar"),
    ("/v1/completions", {"prompt": ""}, "prompt must be a non-empty string"),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt token id 99999 is outside"),
    ("/v1/completions", {"prompt": [[1], {}]}, "prompt[1] must be a non-empty string"),
    ("/v1/completions", {}, "prompt must be a non-empty string"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}', "invalid JSON body"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": 1e400}', "invalid JSON body"),
    ("/v1/completions", b'{"prompt": "\\ud800"}', "invalid JSON body"),
    ("/v1/chat/completions", {"messages": MSG, "seed": -1}, "seed must be at least 0"),
    ("/v1/chat/completions", {"messages": MSG, "seed": 2**70}, "seed must be at most"),
    ("/v1/chat/completions", {"messages": MSG, "top_k": 100000, "temperature": 1},
     "top_k must be less than the vocabulary size"),
    ("/v1/chat/completions", {"messages": MSG, "top_k": 2**64}, "top_k must be at most"),
    ("/v1/chat/completions", {"messages": MSG, "logit_bias": {str(2**70): 1}},
     "logit_bias token id"),
    ("/v1/chat/completions", {"messages": MSG, "logit_bias": {"-1": 1}}, "logit_bias token id"),
    ("/v1/chat/completions", {"messages": MSG, "repetition_penalty": 1.2,
                              "repetition_context_size": 2**40},
     "repetition_context_size must be at most"),
    ("/v1/chat/completions", {"messages": MSG, "stream": "yes"},
     "stream must be of type bool"),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": 5}, "tool_choice must be"),
    ("/v1/chat/completions", {"messages": MSG, "tools": ["x"]},
     "tools must be a list of objects"),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]},
     "text content parts need a string"),
    ("/v1/chat/completions",
     {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": "x"}]},
                   {"role": "user", "content": "hi"}]},
     "tool_calls entries need"),
    ("/v1/chat/completions", {"messages": [5]},
     "messages[0] must be a message object with a role (got 5)"),
])
def test_documented_errors(srv, path, body, message):
    r = post(srv, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith(message)


def test_every_sampler_path_survives_a_failed_request(srv, client):
    """A client mistake must never leave state behind: XTC (a compiled sampler using the
    global random state) still works after each kind of rejected request."""
    for bad in ({"seed": -1}, {"top_k": 100000, "temperature": 1}, {"logit_bias": {"99999": 1}}):
        refused = post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2, **bad})
        assert refused.status_code == 400
        r = client.completions.create(model="m", prompt="hi", max_tokens=4, temperature=1,
                                      extra_body={"xtc_probability": 0.5, "xtc_threshold": 0.1})
        assert r.usage.completion_tokens >= 1


def test_seeded_request_does_not_fix_later_sampling(client):
    kw = dict(model="m", prompt="Once", max_tokens=12, temperature=1.0)
    client.completions.create(seed=11, **kw)
    a = client.completions.create(**kw).choices[0].text
    client.completions.create(seed=11, **kw)
    b = client.completions.create(**kw).choices[0].text
    assert a != b


def test_top_logprobs_minus_one_is_unset(srv):
    r = post(srv, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "top_logprobs": -1})
    assert r.status_code == 200 and "logprobs" not in r.json()["choices"][0]


def test_unknown_path_is_json_404(srv):
    r = httpx.get(srv.base_url + "/v2/whatever")
    assert r.status_code == 404 and r.json()["error"]["message"] == "not found"


def test_sdk_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[])


def test_context_over_budget(srv):
    ctx = srv.engine.model.context_window
    r = post(srv, "/v1/completions", {"prompt": "a " * (ctx + 10), "max_tokens": 2})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "memory_admission"
    assert r.json()["error"]["code"] == "context_over_budget"


def test_disconnect_cancels_generation_and_next_request_works(srv, client):
    """A client that walks away mid-stream stops the decode loop; the server stays healthy."""
    engine = srv.engine
    done_before = engine.completed
    eos_ban = {str(i): -100 for i in engine.model.tokenizer.eos_token_ids}
    with httpx.stream("POST", srv.v1 + "/completions", timeout=60,
                      json={"prompt": "Once", "max_tokens": 100000, "stream": True,
                            "temperature": 1.0, "logit_bias": eos_ban}) as r:
        for i, _line in enumerate(r.iter_lines()):
            if i > 5:
                break
    deadline = time.time() + 20
    while (engine.completed == done_before or engine.worker.active) and time.time() < deadline:
        time.sleep(0.05)  # counted done a moment before its lane lets go of the row
    assert engine.completed == done_before + 1 and engine.worker.active == 0
    r = client.completions.create(model="m", prompt="Hi", max_tokens=3)
    assert r.usage.completion_tokens >= 1


def test_failed_request_does_not_harm_next(client, srv):
    assert post(srv, "/v1/chat/completions", b"[").status_code == 400
    r = client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_concurrent_requests_all_complete(client):
    results = []

    def one(i):
        r = client.completions.create(model="m", prompt=f"Number {i}", max_tokens=4, temperature=0)
        results.append(r.usage.completion_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert len(results) == 4 and all(n >= 1 for n in results)


def test_logit_bias_steers_every_token(client):
    r = client.completions.create(model="m", prompt="Once", max_tokens=5, temperature=0.8, seed=1,
                                  logit_bias={"300": 100}, extra_body={"logprobs": True})
    assert [e["id"] for e in r.choices[0].logprobs.content] == [300] * 5


def test_all_mlx_lm_sampler_extras_accepted(client):
    r = client.completions.create(model="m", prompt="Once", max_tokens=6, temperature=0.7,
                                  top_p=0.9, seed=3, presence_penalty=0.5, frequency_penalty=0.5,
                                  extra_body={"top_k": 20, "min_p": 0.05, "xtc_probability": 0.5,
                                              "xtc_threshold": 0.1, "repetition_penalty": 1.2,
                                              "repetition_context_size": 10,
                                              "presence_context_size": 10,
                                              "frequency_context_size": 10})
    assert r.usage.completion_tokens >= 1


def test_repetition_penalty_changes_greedy_output(client):
    kw = dict(model="m", prompt="Once upon a time", max_tokens=24, temperature=0)
    plain = client.completions.create(**kw, extra_body={"logprobs": True})
    penalized = client.completions.create(**kw, extra_body={"logprobs": True,
                                                            "repetition_penalty": 5.0,
                                                            "repetition_context_size": 0})
    ids = [e["id"] for e in plain.choices[0].logprobs.content]
    pids = [e["id"] for e in penalized.choices[0].logprobs.content]
    assert len(set(ids)) < len(ids), "needs a repeating greedy baseline"
    assert ids != pids


def test_generation_config_defaults_apply_and_requests_win(tmp_path):
    from mlxbun_core.testing.checkpoints import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "g", "llama", seed=3,
                            generation_config={"temperature": 0.6, "top_p": 0.8})
    s = start_server(ckpt, defaults={"top_k": 5})
    try:
        row = httpx.get(s.v1 + "/models").json()["data"][0]
        assert row["gen_defaults"] == {"temperature": 0.6, "top_p": 0.8, "top_k": 5,
                                       "max_tokens": None}  # an engine without a cap
        assert s.engine.parse_chat({"messages": MSG, "temperature": 0}).sampling.temperature == 0
        assert s.engine.parse_chat({"messages": MSG}).sampling.temperature == 0.6
    finally:
        s.stop()


def test_queue_full_is_429(srv):
    worker = srv.engine.worker
    saved, worker.max_waiting = worker.max_waiting, 0
    try:
        r = post(srv, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2})
    finally:
        worker.max_waiting = saved
    assert r.status_code == 429
    error = r.json()["error"]
    assert error["type"] == "resource_admission" and error["code"] == "queue_full"
    assert post(srv, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2}).status_code == 200


def test_developer_role_is_rendered_as_system(srv):
    dev = prepare_chat(srv.engine, {"messages": [{"role": "developer", "content": "Be brief."},
                                                 {"role": "user", "content": "hi"}]})
    sys_ = prepare_chat(srv.engine, {"messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "hi"}]})
    assert dev.request.prompt_tokens == sys_.request.prompt_tokens


def p2r_records(text):
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("[p2r] ")]


def test_p2r_trace_records_phases_when_enabled(srv, client, capfd, monkeypatch):
    capfd.readouterr()
    client.completions.create(model="m", prompt="Hi", max_tokens=2)
    assert p2r_records(capfd.readouterr().err) == []  # off by default
    configure(monkeypatch, server={"p2r_trace": True})
    client.chat.completions.create(model="m", messages=MSG, max_tokens=3,
                                   extra_headers={"x-mlxbun-trace-id": "t-123"})
    list(client.completions.create(model="m", prompt="Hi", max_tokens=3, stream=True))
    recs = stderr_records(capfd, p2r_records, 2)  # the stream's record lands as it ends
    post(srv, "/v1/chat/completions", b"{broken")
    recs += stderr_records(capfd, p2r_records, 1)
    assert [r["outcome"] for r in recs] == ["success", "success", "error"]
    chat, comp, bad = recs
    assert chat["traceId"] == "t-123" and chat["requestId"].startswith("chatcmpl-")
    assert chat["route"] == "/v1/chat/completions" and chat["clock"] == "monotonic-ms"
    phases = [e["phase"] for e in chat["events"]]
    for p in ("request.body_parse", "request.prompt_prepare", "completion.total",
              "engine.admission_wait", "cache.lookup_restore", "prefill.total",
              "token_zero.total", "response.final_write"):
        assert p in phases
    assert comp["traceId"] == comp["requestId"] and "response.first_write" in [
        e["phase"] for e in comp["events"]]
    assert bad["attributes"]["stage"] == "body_parse"
    starts = [e["startMs"] for e in chat["events"]]
    assert starts == sorted(starts) and chat["totalMs"] >= max(starts)


def test_base_model_without_chat_template_gets_a_plain_transcript(tmp_path):
    from mlx_lm.server import convert_chat
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from mlxbun_core.testing.checkpoints import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "base", "llama", seed=3)
    cfg_path = ckpt / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template")
    cfg_path.write_text(json.dumps(cfg))
    s = start_server(ckpt)
    try:
        msgs = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]
        prepared = prepare_chat(s.engine, {"messages": msgs})
        tok = load_tokenizer(ckpt)
        assert prepared.request.prompt_tokens == tok.encode(convert_chat(msgs))
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=3)
        assert r.usage.completion_tokens >= 1
    finally:
        s.stop()


def test_non_stream_disconnect_cancels_generation(srv):
    engine = srv.engine
    done_before = engine.completed
    ban = {str(i): -100 for i in engine.model.tokenizer.eos_token_ids}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.v1 + "/completions", timeout=1.0, json={
            "prompt": "Once", "max_tokens": 100000, "temperature": 1.0, "logit_bias": ban})
    deadline = time.time() + 20
    while (engine.completed == done_before or engine.worker.active) and time.time() < deadline:
        time.sleep(0.05)  # counted done a moment before its lane lets go of the row
    assert engine.completed == done_before + 1 and engine.worker.active == 0
