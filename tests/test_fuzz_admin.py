"""Generated bodies against the admin POST routes (adapters, fine-tune, quantize) of a real
server: never a 5xx, errors in the route's own shape. Bodies that could start a job point at
paths that do not exist, so no mutation starts real work."""

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from mlxbun_core.testing import fuzz
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

EXAMPLES = int(os.environ.get("MLXBUN_FUZZ_EXAMPLES_ADMIN", "150"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    data = tmp_path_factory.mktemp("dataset")
    rows = [{"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "yo"}]}]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows * 3) + "\n")
    return fuzz.admin_seeds(str(tiny_checkpoint("llama", seed=3)), str(data))


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")  # job stores and outputs land here, not in ~
    mp = pytest.MonkeyPatch()
    mp.setenv("MLXBUN_HOME", str(home))
    srv = start_server(tiny_checkpoint("llama", seed=3), max_tokens=4)
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client
    srv.stop()
    mp.undo()


@pytest.mark.parametrize("route", fuzz.ADMIN)
def test_no_admin_body_gets_a_5xx(route, http, seeds):
    statuses = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(sent=fuzz.encoded(route, seeds))
    def one(sent):
        r = http.post(route, content=sent, headers={"content-type": "application/json"})
        fuzz.check_reply(route, sent, r.status_code, r.headers.get("content-type", ""), r.text)
        statuses.append(r.status_code)

    one()
    assert len(statuses) >= EXAMPLES
    jobs = http.get("/api/jobs").json()
    assert jobs["ok"] is True and jobs["jobs"] == []  # nothing was started
