"""The guard decides on the route a request reaches, never on how its path is spelled.

A remote client (in a network namespace this module creates, reaching the server through
a veth pair) asks every guarded route of a keyless server bound to 0.0.0.0 with its path
in other letter cases, percent-encoded, with doubled and trailing slashes and dot
segments, over raw HTTP so every byte is sent as written. The app's own router is the
oracle: whenever it would hand the request to a route's handler, the answer must be the
guard's 403; otherwise a 404 or 405 (nothing ran). The chat's WebSocket gets the same,
and so does an ``--isolate`` parent."""

from __future__ import annotations

import json
from urllib.parse import unquote

import httpx
import pytest
import websockets.sync.client
from websockets.exceptions import InvalidStatus

from mlxbun_core.server.guard import LOOPBACK_ONLY
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.fuzz_guard import raw_request, routed, sample
from mlxbun_core.testing.hub_cache import library_env, library_hub
from mlxbun_core.testing.netns import remote_host
from mlxbun_core.testing.process import serve
from mlxbun_core.testing.server import free_port, start_server

FORBIDDEN = {"error": {"message": LOOPBACK_ONLY, "type": "permission_error"}}
# routes the issue names: each must be among the guarded ones the router lists
NAMED = {("GET", "/api/sessions/search"), ("POST", "/api/settings/hf-token"),
         ("GET", "/api/jobs"), ("GET", "/api/gc/plan"), ("GET", "/v1/adapters"),
         ("POST", "/admin/cache/flush"), ("GET_WS", "/ws/chat"),
         ("GET", "/api/settings/tool-approvals"), ("GET", "/v1/memory/synthesize")}


@pytest.fixture(scope="module")
def remote():
    with remote_host() as host:
        yield host


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    hf = tmp_path_factory.mktemp("hf")  # a route that did run could not touch a real token
    mp.setenv("HF_HOME", str(hf))
    mp.setenv("HF_TOKEN_PATH", str(hf / "token"))
    mp.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # and reaches no hub
    s = start_server(tiny_checkpoint("qwen3"), host="0.0.0.0",
                     sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()
    mp.undo()


def app_of(server):
    return server.server.config.app


def guarded_routes(app) -> list[tuple[str, str]]:
    """``(method, path)`` for every route the guard keeps from keyless remote clients."""
    rules = app.state.guard
    out = []
    for method, routes in app.router.routes.items():
        for route in routes:
            pattern = route.pattern.decode()
            if pattern.startswith(rules.admin_prefixes):
                out.append((method.decode(), sample(pattern)))
    return sorted(set(out))


def variants(path: str) -> list[str]:
    """``path`` spelled every way a router or a proxy may read as it (or not)."""
    head, _, rest = path[1:].partition("/")
    flip = "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(path))
    return [path.upper(), path.title(), flip, path + "/", path + "//", "/" + path,
            f"/{head}//{rest}" if rest else path + "//",
            f"/%{ord(head[0]):02X}{head[1:]}/{rest}", f"/%{ord(head[0]):02x}{head[1:]}/{rest}",
            f"/{head}%2F{rest}" if rest else path, f"/{head}%2f{rest}".upper(),
            f"/x/../{path[1:]}", f"/./{path[1:]}", f"/{head}/./{rest}",
            f"/X/..{path.upper()}", f"//x{path}", "/" + "%2e%2e/" + path[1:]]


def ask_all(host: str, port: int, asks: list[tuple[str, str]]) -> list[tuple[int, bytes]]:
    out = []
    for method, target in asks:
        body = b"{}" if method in ("POST", "PUT", "PATCH", "DELETE") else b""
        out.append(raw_request(host, port, method, target,
                               {"Content-Type": "application/json"}, body))
    return out


def decoded(body: bytes):
    """A JSON body, or the raw bytes when the answer is not JSON (chunked or text)."""
    try:
        return json.loads(body)
    except ValueError:
        return body


def test_every_guarded_route_refuses_every_spelling_from_a_remote_client(server, remote):
    app = app_of(server)
    routes = guarded_routes(app)
    assert set(routes) >= NAMED, NAMED - set(routes)  # the routes the issue names are among
    asks = [(m, v) for m, p in routes if m != "GET_WS" for v in [p, *variants(p)]]
    answers = remote.call(ask_all, remote.host_ip, server.port, asks)
    wrong = []
    for (method, target), (status, body) in zip(asks, answers):
        if routed(app, method, target):
            ok = status == 403 and decoded(body) == FORBIDDEN
        else:  # no handler runs: not found, or refused before the router looked
            ok = status in (403, 404, 405)
        if not ok:
            wrong.append((method, target, status, body[:120]))
    assert not wrong, f"{len(wrong)} of {len(asks)} answers let a remote client in: {wrong}"
    # the same spellings from loopback reach the routes (the guard refuses no one here)
    status, body = raw_request("127.0.0.1", server.port, "GET", "/API/Sessions/Search?q=x")
    assert (status, decoded(body)) == (200, {"ok": True, "results": []})


def ws_status(url: str) -> tuple[int, object]:
    try:
        with websockets.sync.client.connect(url, open_timeout=30):
            return 101, None
    except InvalidStatus as exc:
        return exc.response.status_code, decoded(exc.response.body or b"")


def ws_all(urls: list[str]) -> list[tuple[int, object]]:
    return [ws_status(u) for u in urls]


def test_the_chat_socket_refuses_every_spelling_from_a_remote_client(server, remote):
    app = app_of(server)
    paths = ["/ws/chat", *variants("/ws/chat"), "/ws/%63hat", "/%77s/chat"]
    urls = [remote.url(server.port, "ws") + p for p in paths]
    answers = remote.call(ws_all, urls)
    wrong = []
    for path, (status, body) in zip(paths, answers):
        # uvicorn hands a WebSocket its decoded path, and BlackSheep routes that
        match = app.router.get_match_by_method_and_path("GET_WS", unquote(path))
        if match is not None and match.pattern != b"*":
            ok = status == 403 and body == FORBIDDEN
        else:
            ok = status in (403, 404)
        if not ok:
            wrong.append((path, status, body))
    assert not wrong, wrong
    # a loopback client opens it, by any spelling the router takes
    assert ws_status(f"ws://127.0.0.1:{server.port}/WS/Chat")[0] == 101


def test_an_upgrade_to_a_path_without_a_socket_is_a_404(server):
    for path in ("/health", "/v1/models", "/nope", "/ws/chat/more"):
        status, body = ws_status(f"ws://127.0.0.1:{server.port}{path}")
        assert status == 404, (path, status, body)
        assert body["error"]["type"] == "not_found_error" and path in body["error"]["message"]
    assert httpx.get(f"http://127.0.0.1:{server.port}/health").json() == {"status": "ok"}


# -------------------------------------------------------------------------- --isolate
def test_the_isolate_parent_classifies_every_route_as_the_server_does(server):
    """The parent has no router: for every route of the in-process app (and its spellings),
    its rules refuse a keyless remote client exactly where the server's guard does, and
    ask a key exactly where the server's does."""
    from mlxbun_core.isolate import access

    app = app_of(server)
    rules = app.state.guard
    keyless, keyed = access.rules(None), access.rules("k")
    for method, routes in app.router.routes.items():
        if method == b"GET_WS":
            continue
        for route in routes:
            pattern = route.pattern.decode()
            for path in (sample(pattern), sample(pattern).upper(), sample(pattern) + "/"):
                scope = {"type": "http", "method": method.decode(), "path": path,
                         "client": ("192.0.2.7", 5000), "headers": [(b"host", b"h")]}
                answer = access.check(scope, access.prepare(dict(scope)), keyless)
                assert (answer is not None) == rules.is_admin(pattern), (method, path, answer)
                answer = access.check(scope, access.prepare(dict(scope)), keyed)
                open_here = any(pattern == p or (p.endswith("/*") and pattern.startswith(p[:-1]))
                                for p in rules.open_paths)
                assert (answer is None) == open_here, (method, path, answer)



@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    root = tmp_path_factory.mktemp("iso")
    library_hub(root / "hf" / "hub")
    with serve("--isolate", "--host", "0.0.0.0", "Tiny-Llama", env=library_env(root),
               ready="/engine", timeout=180) as proc:
        yield proc.port


# the engine's router takes each of these for a guarded route (the proxy removes dot
# segments before it forwards); the last two reach no route at all, so nothing runs
ISOLATE_ASKS = [("POST", "/ADMIN/cache/flush"), ("POST", "/Admin/Cache/Flush/"),
                ("POST", "/v1/../admin/cache/flush"), ("POST", "/x/../ADMIN/cache/flush"),
                ("POST", "/./admin/cache/flush"), ("POST", "/API/settings/hf-token"),
                ("GET", "/API/jobs"), ("GET", "/API/sessions/search?q=x"),
                ("GET", "/V1/adapters"), ("GET", "/v1/Memory/status"),
                ("GET", "/V1/MEMORY/synthesize"), ("GET", "/v1/models/../../api/jobs"),
                ("GET", "/v1/../API/gc/plan/")]
UNROUTED = [("POST", "//x/admin/cache/flush"), ("POST", "//x/api/settings/hf-token"),
            ("GET", "//x/v1/adapters"), ("GET", "/%61pi/jobs")]


def test_an_isolate_parent_refuses_every_spelling_from_a_remote_client(parent, remote):
    answers = remote.call(ask_all, remote.host_ip, parent, ISOLATE_ASKS + UNROUTED)
    expected = [403] * len(ISOLATE_ASKS) + [404] * len(UNROUTED)
    wrong = [(ask, status, body[:160]) for ask, want, (status, body)
             in zip(ISOLATE_ASKS + UNROUTED, expected, answers)
             if status != want or (want == 403 and decoded(body) != FORBIDDEN)]
    assert not wrong, wrong
    status, body = remote.call(ws_status, remote.url(parent, "ws") + "/WS/chat")
    assert status == 403 and body == FORBIDDEN
    # from loopback: the chat needs an in-process engine (501); no other path has a socket
    assert ws_status(f"ws://127.0.0.1:{parent}/Ws/Chat/")[0] == 501
    status, body = ws_status(f"ws://127.0.0.1:{parent}/health")
    assert status == 404 and "no WebSocket at /health" in body["error"]["message"]
    # the API stays open to the network, in any letter case the engine's router takes
    r = remote.call(httpx.post, remote.url(parent) + "/V1/completions",
                    json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
