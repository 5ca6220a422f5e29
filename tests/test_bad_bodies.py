"""Every body that once answered a 5xx (or dropped the connection) now gets a clear 4xx in
its surface's shape, and the server answers the next request. One case per root cause the
fuzzer (test_fuzz_bodies.py) found; each fails on the code before its fix."""

import json

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.fuzz import ANTHROPIC, ROUTES, error_shape_ok
from mlxbun_core.testing.helpers import configure
from mlxbun_core.testing.server import start_server

USER = [{"role": "user", "content": "hi"}]
BASE = {"/v1/chat/completions": {"messages": USER, "max_tokens": 2},
        "/v1/completions": {"prompt": "hi", "max_tokens": 2},
        "/v1/responses": {"input": "hi", "max_output_tokens": 2},
        "/v1/messages": {"messages": USER, "max_tokens": 2},
        "/v1/messages/count_tokens": {"messages": USER},
        "/v1/embeddings": {"input": "hi"}}
GENERATION = [r for r in ROUTES if r != "/v1/embeddings"]


@pytest.fixture(scope="module")
def srv():
    s = start_server(tiny_checkpoint("llama", seed=3), max_tokens=4)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client


def rejected(http, route, sent, status=400, says=""):
    data = sent if isinstance(sent, bytes) else json.dumps(sent).encode()
    r = http.post(route, content=data, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    body = r.json()
    assert error_shape_ok(route, body), body
    assert says in body["error"]["message"], body
    assert (body.get("type") == "error") is (route in ANTHROPIC)
    return body


def still_serves(http):
    r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("route", ROUTES)
def test_deep_nesting_is_a_400_before_the_decoder_recurses(http, route):
    """Was 500 "maximum recursion depth exceeded" on every route."""
    rejected(http, route, b"[" * 5000 + b"]" * 5000, says="nested deeper than 64 levels")
    deep_field = json.dumps(BASE[route])[:-1] + ', "metadata": ' + "[" * 100 + "]" * 100 + "}"
    rejected(http, route, deep_field.encode(), says="nested deeper than 64 levels")
    still_serves(http)


@pytest.mark.parametrize("route", GENERATION)
@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty", "temperature",
                                   "repetition_penalty"])
def test_integers_beyond_int64_never_reach_a_kernel(http, route, field):
    """Was 500 ``std::bad_cast`` (MLX cannot cast the Python int), e.g. presence_penalty on
    /v1/messages."""
    rejected(http, route, {**BASE[route], field: 9223372036854775808}, says=field)
    still_serves(http)


@pytest.mark.parametrize("stream", [False, True])
def test_xtc_threshold_is_checked_before_sampling(http, stream):
    """mlx-lm checks 0 <= threshold <= 0.5 only when it samples: a 500, or an error event
    after a 200 when streaming."""
    rejected(http, "/v1/completions", {**BASE["/v1/completions"], "stream": stream,
                                       "xtc_probability": 0.5, "xtc_threshold": 0.9},
             says="xtc_threshold must be at most 0.5")
    still_serves(http)


@pytest.mark.parametrize("value,says", [(1e300, "between -100 and 100"), (10**400, "between"),
                                        ("1", "token id to a number"),
                                        (True, "token id to a number")])
def test_logit_bias_values_are_bounded_numbers(http, value, says):
    """10**400 was a 500 ("int too large to convert to float"); strings and bools passed."""
    body = {**BASE["/v1/chat/completions"], "logit_bias": {"5": value}}
    rejected(http, "/v1/chat/completions", body, says=says)


@pytest.mark.parametrize("kind", [[], {}, ["image_url"]])
def test_content_part_type_of_the_wrong_type(http, kind):
    """Was 500 "unhashable type" (a list or object looked up among the media part kinds)."""
    body = {"messages": [{"role": "user", "content": [{"type": kind, "text": "hi"}]}]}
    rejected(http, "/v1/chat/completions", body, says="unsupported content part type")


@pytest.mark.parametrize("route", ANTHROPIC)
@pytest.mark.parametrize("role", [[1, 2], {"type": "function"}])
def test_an_unhashable_anthropic_role_is_a_400(http, route, role):
    """Was 500 "unhashable type" (the Anthropic surface indexed messages by role before it
    checked the role)."""
    body = {"max_tokens": 2, "messages": [{"role": role, "content": "hi"}]}
    rejected(http, route, body, says="messages[0].role must be one of user, assistant, system")
    still_serves(http)


@pytest.mark.parametrize("stream", [False, True])
def test_a_warning_quoting_control_characters_keeps_the_connection(http, stream):
    """A schema the grammar backend refuses is quoted in the Warning header; a control
    character there made uvicorn drop the connection without a response."""
    schema = {"type": "object", "properties": {"a": {"type": "bad\x06type\nline"}}}
    r = http.post("/v1/chat/completions", json={
        **BASE["/v1/chat/completions"], "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}})
    assert r.status_code == 200, r.text
    warning = r.headers["warning"]
    assert warning.isascii() and "\\x06" in warning and "\n" not in warning


def test_body_over_the_cap_is_413_and_never_read(http, monkeypatch):
    configure(monkeypatch, server={"max_body_bytes": 4096})
    big = {"messages": [{"role": "user", "content": "x" * 8000}]}
    for route in ("/v1/chat/completions", "/v1/messages"):
        body = rejected(http, route, big, status=413, says="larger than 4096 bytes")
        if route in ANTHROPIC:
            assert body["error"]["type"] == "request_too_large"

    def chunked():  # no Content-Length: the cap applies while reading
        yield json.dumps(big).encode()

    r = http.post("/v1/chat/completions", content=chunked())
    assert r.status_code == 413 and "larger than 4096" in r.json()["error"]["message"]
    configure(monkeypatch, server={"max_body_bytes": None})
    still_serves(http)


@pytest.mark.parametrize("sent,says", [
    (b"", "request body is empty"), (b"  \n", "request body is empty"),
    (b"\xff\xfe{}", "not valid UTF-8"), (b"[1, 2]", "expected an object, got an array"),
    (b"null", "expected an object, got null"), (b'{"a": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"prompt": "\\ud800"}', "unpaired UTF-16 surrogate"),
])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/messages", "/v1/embeddings"])
def test_not_a_json_object(http, route, sent, says):
    rejected(http, route, sent, says=says)


def test_isolate_parent_reads_bodies_with_the_same_parser():
    """The --isolate proxy peeks at bodies (the model to route by, Responses history);
    a deep body raised RecursionError there, outside any error handler."""
    from mlxbun_core.isolate.policy import PoolPolicy, routing_fields
    from mlxbun_core.isolate.responses import ParentResponses

    deep = b'{"model": "m", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    # routed to the default engine, which answers the 400
    assert routing_fields(deep, PoolPolicy()).model is None
    assert ParentResponses().prepare(deep) == (deep, None, None)  # forwarded untouched
    assert routing_fields(b'{"model": "m", "input": "hi"}', PoolPolicy()).model == "m"


@pytest.mark.parametrize("name", ["a" * 5000, "\x00", "m\x00/x", "/" + "b" * 300 + "/c"])
def test_impossible_model_names_are_not_found(http, name):
    """A path component too long for the filesystem (OSError) or a NUL (ValueError) was a 500
    from /api/quantize/inspect, which resolves the name like `mlxbun serve` does."""
    r = http.post("/api/quantize/inspect", json={"model_id": name})
    assert r.status_code == 200 and r.json()["ok"] is False, r.text
    assert r.json()["error"]
