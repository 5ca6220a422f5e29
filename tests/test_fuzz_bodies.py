"""Thousands of generated bodies against every POST route of a real server.

Whatever a client sends, the answer is never a 5xx, a 4xx comes in the surface's
own error shape, a stream that starts ends properly with no error event, the
connection is never dropped, and the server answers a valid request exactly as
before. ``MLXBUN_FUZZ_EXAMPLES`` raises the count per route for a deeper run.

And the guard's probes (issue #31): a body not declared JSON never reaches a route (a 415
in the surface's shape), and no chat frame, whatever its fields hold, is answered with a
5xx or leaves a traceback in the log.
"""

import logging
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxbun_core.testing import fuzz, fuzz_guard
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webchat import frames

EXAMPLES = int(os.environ.get("MLXBUN_FUZZ_EXAMPLES", "400"))
# a template that renders tools, tool calls and their arguments, so those shapes reach Jinja
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{%- for t in tools %}{{ t | tojson }}\n{%- endfor %}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
PROBE = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 6,
         "temperature": 0}


@pytest.fixture(scope="module")
def srv():
    # unset lengths default to 4 tokens: no generated body can ask for a long generation
    s = start_server(tiny_checkpoint("qwen3", seed=5, chat_template=TOOLS_TEMPLATE), max_tokens=4)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.base_url, timeout=httpx.Timeout(30.0)) as client:
        yield client


def probe(http) -> str:
    r = http.post("/v1/chat/completions", json=PROBE)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def baseline(http):
    return probe(http)


def send(http, route: str, sent: bytes) -> int:
    # an exception here (a dropped connection, a read timeout) fails the test
    r = http.post(route, content=sent, headers={"content-type": "application/json"})
    fuzz.check_reply(route, sent, r.status_code, r.headers.get("content-type", ""), r.text)
    return r.status_code


@pytest.mark.parametrize("route", fuzz.ROUTES)
def test_no_body_gets_a_5xx(route, http, baseline):
    statuses = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(sent=fuzz.encoded(route))
    def one(sent):
        statuses.append(send(http, route, sent))

    one()
    assert len(statuses) >= EXAMPLES  # every body was sent …
    if route != "/v1/embeddings":  # … and many reached the model (a tiny generative one here)
        assert statuses.count(200) >= EXAMPLES // 10, sorted(set(statuses))
    assert http.get("/health").json() == {"status": "ok"}
    assert probe(http) == baseline  # the same greedy answer: nothing leaked into the next request


@pytest.mark.parametrize("route", fuzz.ROUTES)
def test_a_body_not_declared_json_never_reaches_a_route(route, http, baseline):
    @settings(max_examples=EXAMPLES // 8, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(sent=fuzz.encoded(route), ctype=st.sampled_from(fuzz_guard.NOT_JSON))
    def one(sent, ctype):
        headers = {} if ctype is None else {"content-type": ctype}
        r = http.post(route, content=sent or b"x", headers=headers)
        where = f"{route} {ctype} {sent[:200]!r}: {r.status_code} {r.text[:200]}"
        assert r.status_code == 415, where
        assert fuzz.error_shape_ok(route, r.json()), where

    one()
    assert probe(http) == baseline


def test_no_chat_frame_gets_a_5xx_or_a_traceback(srv, http, baseline, caplog):
    errors = []
    with ChatClient(srv.base_url) as c, caplog.at_level(logging.INFO):
        c.hello()
        c.turn(text="hi")  # an open session: frames about it reach the session store

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(frame=fuzz_guard.chat_frame(frames.FIELDS, frames.REQUIRED))
        def one(frame):
            c.send_frame(frame)
            c.send("list_sessions")  # its answer marks where the frame's answers end
            for reply in c.until("sessions"):
                if reply["type"] == "error":
                    assert reply.get("status", 500) < 500, (frame, reply)
                    errors.append(reply)

        one()
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not failed, failed
    assert len(errors) >= EXAMPLES // 4  # most frames were wrong somewhere, and said so
    assert http.get("/health").json() == {"status": "ok"}
    assert probe(http) == baseline
