"""Generated bodies against /v1/embeddings of a real embedding server: never a 5xx, errors
in the OpenAI shape, and the same vector for a valid request afterwards."""

import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from mlxbun_core.model import LoadOptions
from mlxbun_core.testing import fuzz
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

EXAMPLES = int(os.environ.get("MLXBUN_FUZZ_EXAMPLES", "300"))
ROUTE = "/v1/embeddings"


@pytest.fixture(scope="module")
def http():
    srv = start_server(tiny_checkpoint("qwen3", seed=12), options=LoadOptions(embedding=True))
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client
    srv.stop()


def vector(http):
    r = http.post(ROUTE, json={"input": "the cat sat on the mat"})
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["embedding"]


def test_no_embeddings_body_gets_a_5xx(http):
    before = vector(http)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(sent=fuzz.encoded(ROUTE))
    def one(sent):
        r = http.post(ROUTE, content=sent, headers={"content-type": "application/json"})
        fuzz.check_reply(ROUTE, sent, r.status_code, r.headers.get("content-type", ""), r.text)

    one()
    assert vector(http) == before
