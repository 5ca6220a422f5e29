"""Pages of other sites cannot drive a keyless server on loopback.

A browser lets any page send requests to 127.0.0.1 and open WebSockets to it; these tests
send what such a page would (raw HTTP with ``Origin: http://evil.example``, a
``text/plain`` POST, a WebSocket handshake from that origin, a DNS-rebinding ``Host``) and
check each is refused in its surface's error shape, while the server's own page, the
official SDKs and clients without an ``Origin`` go on as before. ``--cors`` opens exactly
the sites it names. Approvals of coding tools come only from the page that showed the card.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket

import anthropic
import httpx
import openai
import pytest
import websockets.sync.client
from websockets.exceptions import InvalidStatus

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import free_port, start_server
from mlxbun_core.testing.wschat import ChatClient
from scripted_model import scripted_server

EVIL = "http://evil.example"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    hf = tmp_path_factory.mktemp("hf")
    mp.setenv("HF_HOME", str(hf))
    mp.setenv("HF_TOKEN_PATH", str(hf / "token"))
    mp.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    s = start_server(tiny_checkpoint("qwen3"), max_tokens=2,
                     sessions_dir=tmp_path_factory.mktemp("sessions"))
    s.token = hf / "token"
    yield s
    s.stop()
    mp.undo()


def raw(server, method: str, path: str, body: bytes = b"", host: str | None = None,
        **headers: str) -> tuple[int, dict, object]:
    """One HTTP request with exactly these headers: (status, headers, JSON body or text)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{server.port}'}",
             "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    got = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    if got.get("transfer-encoding") == "chunked":
        rest = _unchunk(rest)
    try:
        parsed: object = json.loads(rest)
    except ValueError:
        parsed = rest
    return int(status_line.split()[1]), got, parsed


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + data[:n], data[n + 2:]
    return out


def json_post(server, path: str, body: dict, **headers: str):
    return raw(server, "POST", path, json.dumps(body).encode(),
               Content_Type=headers.pop("Content_Type", "application/json"), **headers)


@contextlib.contextmanager
def cors(server, *values: str):
    """The server's ``--cors`` set to ``values`` for the block."""
    from mlxbun_core.server.origin import CorsRules

    rules = server.server.config.app.state.guard
    before, rules.cors = rules.cors, CorsRules.from_values(values)
    try:
        yield
    finally:
        rules.cors = before


def ws_status(server, path: str = "/ws/chat", origin: str | None = None,
              host: str | None = None) -> tuple[int, object]:
    headers = {"Host": host} if host else None
    url = f"ws://127.0.0.1:{server.port}{path}"
    try:
        with websockets.sync.client.connect(url, origin=origin, additional_headers=headers,
                                            open_timeout=30):
            return 101, None
    except InvalidStatus as exc:
        body = exc.response.body or b""
        return exc.response.status_code, json.loads(body) if body else None


def refused(answer, *, anthropic_shape: bool = False) -> str:
    """The message of a guard refusal (403, permission_error) in the route's shape."""
    status, _, body = answer
    assert status == 403, answer
    if anthropic_shape:
        assert body["type"] == "error" and body["error"]["type"] == "permission_error", body
    else:
        assert body["error"]["type"] == "permission_error", body
    return body["error"]["message"]


def test_a_page_of_another_site_cannot_send_state_changing_requests(server, caplog):
    with caplog.at_level(logging.INFO, logger="mlxbun.guard"):
        for ctype in ("text/plain", "application/json"):
            answer = json_post(server, "/api/settings/hf-token", {"token": "hf_evil_0123456789"},
                               Origin=EVIL, Content_Type=ctype)
            assert "evil.example" in refused(answer) and "--cors" in refused(answer)
        assert not server.token.exists()  # the hub token was not set
        refused(json_post(server, "/v1/chat/completions", CHAT, Origin=EVIL))
        refused(json_post(server, "/v1/messages", MESSAGES, Origin=EVIL), anthropic_shape=True)
        refused(raw(server, "DELETE", "/api/settings/tool-approvals", Origin=EVIL))
        refused(json_post(server, "/admin/cache/flush", {}, Origin="null"))
    assert sum("refused POST /api/settings/hf-token" in r.getMessage()
               for r in caplog.records) == 2  # one line per refusal, with the reason
    # admin routes refuse other sites on reads too, and so does a cross-site <img> GET
    refused(raw(server, "GET", "/api/sessions/search?q=x", Origin=EVIL))
    refused(raw(server, "GET", "/v1/memory/synthesize", Sec_Fetch_Site="cross-site"))
    # an API read from another site runs, but the page may not read it: no CORS headers
    status, headers, body = raw(server, "GET", "/v1/models", Origin=EVIL)
    assert status == 200 and "access-control-allow-origin" not in headers


def test_the_servers_own_page_and_clients_without_origin_go_on(server):
    own = f"http://127.0.0.1:{server.port}"
    status, _, body = json_post(server, "/v1/chat/completions", CHAT, Origin=own)
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    # every loopback name is this machine: the page at localhost posting to 127.0.0.1
    status, _, _ = json_post(server, "/v1/completions", {"prompt": "hi"},
                             Origin=f"http://localhost:{server.port}")
    assert status == 200
    refused(json_post(server, "/v1/completions", {"prompt": "hi"},
                      Origin=f"http://localhost:{server.port + 1}"))  # another port: not us
    refused(json_post(server, "/v1/completions", {"prompt": "hi"},
                      Origin=f"https://127.0.0.1:{server.port}"))  # another scheme: not us
    status, _, body = json_post(server, "/api/settings/hf-token", {"token": "hf_own_0123456789"},
                                Origin=own)
    assert status == 200 and body["hasToken"] is True
    assert raw(server, "DELETE", "/api/settings/hf-token", Origin=own)[0] == 200
    oa = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    assert oa.chat.completions.create(model="m", **CHAT).usage.completion_tokens == 2
    an = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    assert an.messages.create(**MESSAGES).usage.output_tokens == 2


def test_a_body_that_is_not_declared_json_is_a_415_in_the_routes_shape(server):
    body = json.dumps(CHAT).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                  None):
        headers = {} if ctype is None else {"Content_Type": ctype}
        status, _, got = raw(server, "POST", "/v1/chat/completions", body, **headers)
        assert status == 415 and got["error"]["code"] == "unsupported_media_type", (ctype, got)
        status, _, got = raw(server, "POST", "/v1/messages", json.dumps(MESSAGES).encode(),
                             **headers)
        assert status == 415 and got["type"] == "error", got
        status, _, got = raw(server, "POST", "/api/settings/hf-token",
                             b'{"token": "hf_plain_0123456789"}', **headers)
        assert (status, got["ok"]) == (415, False) and "Content-Type" in got["error"], got
    assert not server.token.exists()
    for ctype in ("application/json", "application/json; charset=utf-8",
                  "Application/JSON", "application/vnd.mlxbun+json"):
        status, _, got = raw(server, "POST", "/v1/chat/completions", body, Content_Type=ctype)
        assert status == 200, (ctype, got)
    # an empty body needs no content type (curl -X POST): the route's own answer
    assert raw(server, "POST", "/admin/cache/flush")[0] == 200


def test_a_websocket_from_another_site_is_refused(server):
    status, body = ws_status(server, origin=EVIL)
    assert status == 403 and "evil.example" in body["error"]["message"]
    assert ws_status(server, "/WS/Chat", origin=EVIL)[0] == 403
    assert ws_status(server, origin=f"http://127.0.0.1:{server.port}")[0] == 101
    assert ws_status(server, origin=f"http://localhost:{server.port}")[0] == 101
    assert ws_status(server)[0] == 101  # no Origin: not a browser


def test_a_rebound_host_name_is_refused(server):
    answer = raw(server, "GET", "/v1/models", host="attacker.example")
    assert "attacker.example" in refused(answer)
    refused(raw(server, "GET", "/api/sessions/search?q=x", host=f"attacker.example:{server.port}"))
    refused(json_post(server, "/v1/messages", MESSAGES, host="attacker.example"),
            anthropic_shape=True)
    assert ws_status(server, host=f"attacker.example:{server.port}")[0] == 403
    for host in (f"localhost:{server.port}", "localhost", "127.0.0.1", f"[::1]:{server.port}",
                 f"127.0.0.2:{server.port}", f"app.localhost:{server.port}",
                 f"LOCALHOST:{server.port}"):
        assert raw(server, "GET", "/v1/models", host=host)[0] == 200, host
    assert raw(server, "GET", "/health", host="a b")[0] == 403  # no host name at all


def test_cors_opens_exactly_the_named_sites(server):
    app = "http://app.example:5173"
    with cors(server, app):
        status, headers, body = json_post(server, "/v1/chat/completions", CHAT, Origin=app)
        assert status == 200 and headers["access-control-allow-origin"] == app
        assert headers["vary"] == "Origin"
        pre = raw(server, "OPTIONS", "/v1/chat/completions", Origin=app,
                  Access_Control_Request_Method="POST",
                  Access_Control_Request_Headers="authorization, content-type")
        assert pre[0] == 204 and pre[1]["access-control-allow-origin"] == app
        assert "POST" in pre[1]["access-control-allow-methods"]
        assert pre[1]["access-control-allow-headers"] == "authorization, content-type"
        # a named site is trusted like the server's own page: admin routes and the chat
        assert raw(server, "GET", "/api/sessions/search?q=x", Origin=app)[0] == 200
        assert ws_status(server, origin=app)[0] == 101
        # other sites stay out, preflight included
        refused(json_post(server, "/v1/chat/completions", CHAT, Origin=EVIL))
        pre = raw(server, "OPTIONS", "/v1/chat/completions", Origin=EVIL,
                  Access_Control_Request_Method="POST")
        assert pre[0] == 403 and "access-control-allow-origin" not in pre[1]
        # the site's page can read a refusal too (here: a key it did not send)
        server.server.config.app.state.guard.api_key = "k"
        try:
            status, headers, body = json_post(server, "/v1/chat/completions", CHAT, Origin=app)
        finally:
            server.server.config.app.state.guard.api_key = None
        assert status == 401 and headers["access-control-allow-origin"] == app
        # the site's own name may reach this machine through a proxy (Host)
        assert raw(server, "GET", "/v1/models", host="app.example")[0] == 200
    with cors(server, "*"):  # every site, the API routes only
        status, headers, _ = json_post(server, "/v1/chat/completions", CHAT, Origin=EVIL)
        assert status == 200 and headers["access-control-allow-origin"] == EVIL
        refused(json_post(server, "/api/settings/hf-token", {"token": "hf_x_0123456789"},
                          Origin=EVIL))
        assert ws_status(server, origin=EVIL)[0] == 403
    refused(json_post(server, "/v1/chat/completions", CHAT, Origin=app))  # back to none


def test_cors_values_are_checked():
    from mlxbun_core.server.origin import CorsRules

    rules = CorsRules.from_values(["https://App.Example/", "http://localhost:5173", "*"])
    assert rules.any_site and rules.named("https://app.example:443")
    assert rules.named("http://127.0.0.1:5173")  # loopback names are one host
    for bad in ("app.example", "https://app.example/path", "ftp://x", "https://", ""):
        with pytest.raises(ValueError, match="expected an origin"):
            CorsRules.from_values([bad])


def test_the_isolate_parent_checks_origin_host_and_cors(tmp_path, monkeypatch):
    """The parent answers for its engines (they trust its socket): the same refusals and the
    same CORS headers, on what it answers itself and before it forwards anything."""
    import asyncio

    from mlxbun_core.isolate.parent import ParentApp
    from mlxbun_core.isolate.pool import EnginePool, ModelSpec
    from mlxbun_core.library.cache import LibraryCache
    from mlxbun_core.server.origin import CorsRules
    from mlxbun_core.testing.hub_cache import library_env

    for k, v in library_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    app = "http://app.example"
    parent = ParentApp(EnginePool(ModelSpec("m", None), []), LibraryCache(),
                       cors=CorsRules.from_values([app]))

    async def call(method, path, host="localhost", **headers):
        transport = httpx.ASGITransport(app=parent, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as c:
            return await c.request(method, path, headers=headers,
                                   json=CHAT if method == "POST" else None)

    async def main():
        ok = await call("GET", "/health", origin=app)  # no engine has answered: loading
        assert (ok.status_code, ok.json()) == (503, {"status": "loading"})
        assert ok.headers["access-control-allow-origin"] == app
        evil = await call("POST", "/v1/chat/completions", origin=EVIL)
        assert evil.status_code == 403 and "evil.example" in evil.json()["error"]["message"]
        rebound = await call("GET", "/v1/models", host="attacker.example")
        assert rebound.status_code == 403 and "attacker.example" in rebound.text
        pre = await call("OPTIONS", "/v1/chat/completions", origin=app,
                         **{"access-control-request-method": "POST"})
        assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == app
        admin = await call("GET", "/API/jobs", origin=EVIL)
        assert admin.status_code == 403 and "access-control-allow-origin" not in admin.headers
        refused = await call("POST", "/API/jobs", origin=app, host="attacker.example")
        assert refused.status_code == 403 and refused.headers["access-control-allow-origin"] == app

    asyncio.run(main())


# ------------------------------------------------------------------ approvals
def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def granted(srv) -> list:
    return httpx.get(srv.base_url + "/api/settings/tool-approvals").json()["alwaysAllow"]


def test_an_approval_must_echo_its_cards_secret(tmp_path, caplog):
    root = tmp_path / "ws"
    root.mkdir()
    target = root / "a.txt"
    target.write_text("hello\n")
    with scripted_server("", name="scripted-approvals") as (srv, plugin), \
            ChatClient(srv.base_url) as c, caplog.at_level(logging.INFO, "mlxbun.webchat"):
        replies = [call("write", path="a.txt", content="bye\n")]
        plugin.reply = lambda prompt: replies.pop(0) if replies else "Done."
        before = granted(srv)
        c.hello()
        c.send("set_coding_tools", enabled=True, workspace=str(root))
        c.until("coding_tools")
        c.send("prompt", text="change it")
        card = c.until("tool_approval_request")[-1]
        assert isinstance(card["approvalToken"], str) and len(card["approvalToken"]) >= 20
        for token in (None, "", card["approvalToken"][:-1] + "x", ["x"]):
            frame = {"type": "approval", "callId": card["callId"], "decision": "always"}
            if token is not None:
                frame["approvalToken"] = token
            c.send_frame(frame)
            err = c.until("error")[-1]
            assert err["status"] in (400, 403), (token, err)
        assert target.read_text() == "hello\n"  # nothing ran
        assert granted(srv) == before  # and "always" was not saved
        c.send("approval", callId=card["callId"], decision="allow")  # the page echoes it
        frames = c.until("turn_end") + c.until("history")
        assert next(f for f in frames if f["type"] == "tool_end")["ok"]
        assert target.read_text() == "bye\n"
    lines = [r.getMessage() for r in caplog.records if "approval of" in r.getMessage()]
    assert len(lines) == 3 and all(card["callId"] in line for line in lines), lines
