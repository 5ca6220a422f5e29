"""Generated bodies against the admin POST routes (adapters, fine-tune, quantize) of a real
server: never a 5xx, errors in the route's own shape. Bodies that could start a job point at
paths that do not exist, so no mutation starts real work.

And the guard's probes (issue #31): every admin route, spelled any way a router may read as
it and asked with the headers of a page of another site, is refused; a WebSocket upgrade
to any path is a 101 on the chat's socket, else a 4xx."""

import json
import os
from urllib.parse import unquote

import httpx
import pytest
import websockets.sync.client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import InvalidStatus

from mlxbun_core.testing import fuzz, fuzz_guard
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

EXAMPLES = int(os.environ.get("MLXBUN_FUZZ_EXAMPLES_ADMIN", "150"))
GUARD_EXAMPLES = int(os.environ.get("MLXBUN_FUZZ_EXAMPLES_GUARD", "400"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    data = tmp_path_factory.mktemp("dataset")
    rows = [{"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "yo"}]}]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows * 3) + "\n")
    return fuzz.admin_seeds(str(tiny_checkpoint("llama", seed=3)), str(data))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")  # job stores and outputs land here, not in ~
    mp = pytest.MonkeyPatch()
    mp.setenv("MLXBUN_HOME", str(home))
    hf = tmp_path_factory.mktemp("hf")  # a guard probe that got through could not touch a token
    mp.setenv("HF_HOME", str(hf))
    mp.setenv("HF_TOKEN_PATH", str(hf / "token"))
    srv = start_server(tiny_checkpoint("llama", seed=3), max_tokens=4,
                       sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield srv
    srv.stop()
    mp.undo()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


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


def test_no_spelling_of_an_admin_route_lets_another_site_in(server):
    app = server.server.config.app
    admin = fuzz_guard.routes(app, admin=True)
    assert len(admin) > 40
    seen = []

    @settings(max_examples=GUARD_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(admin), data=st.data())
    def one(route, data):
        method, path = route
        target = data.draw(fuzz_guard.spelling(path))
        headers = {**data.draw(fuzz_guard.foreign()), "Content-Type": "application/json"}
        body = b"{}" if method != "GET" else b""
        status, answer = fuzz_guard.raw_request("127.0.0.1", server.port, method, target,
                                                headers, body)
        where = f"{method} {target} {headers}: {status} {answer[:200]!r}"
        if fuzz_guard.routed(app, method, target):
            assert status == 403 and json.loads(answer)["error"]["type"] == "permission_error", \
                where
        else:
            assert status in (403, 404, 405), where
        seen.append(status)

    one()
    assert seen.count(403) >= GUARD_EXAMPLES // 2  # most spellings reach a route
    assert not os.path.exists(os.environ["HF_TOKEN_PATH"])  # no probe set the hub token


def test_a_websocket_upgrade_to_any_path_is_never_a_5xx(server):
    app = server.server.config.app
    paths = [p for _, p in fuzz_guard.routes(app)] + ["/ws/chat"]
    url = f"ws://127.0.0.1:{server.port}"

    @settings(max_examples=GUARD_EXAMPLES // 4, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(paths), data=st.data())
    def one(path, data):
        target = data.draw(fuzz_guard.spelling(path))
        match = app.router.get_match_by_method_and_path("GET_WS", unquote(target))
        try:
            with websockets.sync.client.connect(url + target, open_timeout=30):
                status = 101
        except InvalidStatus as exc:
            status = exc.response.status_code
        socket_here = match is not None and match.pattern != b"*"
        assert status == (101 if socket_here else 404), (target, status)

    one()
