"""/ws/chat against a real server: a real WebSocket client, real MLX forward passes and
real session files. Turns stream and end with the lane they ran on, abort stops the
engine, sessions survive a restart, search and export read them back."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webapp import chat_socket as ws_chat
from mlxbun_core.webapp.state import of as web_state
from mlxbun_core.webchat import frames, turn
from mlxbun_core.webchat.store import read_entries, replayed_messages


def no_eos(engine) -> dict:
    return {str(i): -100 for i in engine.model.tokenizer.eos_token_ids}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(tiny_checkpoint("qwen3"), sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


def last(c: ChatClient, kind: str) -> dict:
    return next(f for f in reversed(c.seen) if f["type"] == kind)


def idle(s, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = httpx.get(s.base_url + "/stats").json()["batch"]
        if batch["active_rows"] == 0 and batch["waiting"] == 0:
            return True
        time.sleep(0.02)
    return False


def test_a_turn_streams_deltas_and_ends_with_the_real_lane(server):
    with ChatClient(server.base_url) as c:
        hello = c.hello()
        assert hello["ready"]["model"] == server.engine.model.id
        assert hello["ready"]["contextWindow"] == server.engine.model.context_window
        assert hello["history"]["items"] == [] and hello["sessions"]["activePath"] is None
        c.send("set_sampling", max_tokens=12, logit_bias=no_eos(server.engine))
        assert c.until("settings")[-1]["sampling"]["max_tokens"] == 12
        frames = c.turn(text="Tell me a story")
    kinds = [f["type"] for f in frames]
    assert kinds.index("turn_start") < kinds.index("text_delta") < kinds.index("turn_end")
    end = next(f for f in frames if f["type"] == "turn_end")
    assert end["finish"] == "length" and end["usage"]["completion_tokens"] == 12
    assert end["lane"] == end["usage"]["lane"] and end["lane"] in ("batched", "serial")
    streamed = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
    items = frames[-1]["items"]
    assert [i["role"] for i in items] == ["user", "assistant"]
    assert items[0]["content"] == "Tell me a story" and items[1]["content"] == streamed
    assert items[1]["meta"]["lane"] == end["lane"]
    context = next(f for f in frames if f["type"] == "context")
    assert context["tokens"] == end["usage"]["prompt_tokens"] + 12
    assert context["contextWindow"] == server.engine.model.context_window


def test_abort_stops_the_engine_within_a_step(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_sampling", max_tokens=20000, logit_bias=no_eos(server.engine))
        c.until("settings")
        c.send("prompt", text="Count forever")
        c.until("text_delta")
        c.send("abort")
        t0 = time.monotonic()
        frames = c.until("turn_end")
        stopped_in = time.monotonic() - t0
        history = c.until("history")[-1]
    end = frames[-1]
    assert end["finish"] == "cancelled"
    assert end["usage"]["completion_tokens"] < 2000 and stopped_in < 5
    assert idle(server)
    answer = history["items"][-1]  # the partial answer is kept, marked as stopped
    assert answer["role"] == "assistant" and answer["meta"]["finish"] == "cancelled"
    assert answer["content"] == "".join(f["delta"] for f in c.seen if f["type"] == "text_delta")


def test_an_answer_is_on_disk_while_it_streams(server):
    """Mid-turn, the session file already holds the answer so far, marked interrupted (a
    reload or a crash keeps it); the finished answer then replaces it in place."""
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_sampling", max_tokens=30000, logit_bias=no_eos(server.engine))
        c.until("settings")
        c.send("prompt", text="Tell me everything")
        path = c.until("sessions")[-1]["activePath"]
        start = time.monotonic()
        while time.monotonic() - start < 4 * turn.SAVE_EVERY_S:
            c.until("text_delta")
        entries = read_entries(Path(path))
        c.send("abort")
        c.until("turn_end")
        history = c.until("history")[-1]["items"]
    streamed = "".join(f["delta"] for f in c.seen if f["type"] == "text_delta")
    [partial] = [e for e in replayed_messages(entries) if e["message"]["role"] == "assistant"]
    assert partial["meta"] == {"finish": "interrupted"}
    saved = partial["message"]["content"]
    assert len(saved) > 0 and streamed.startswith(saved)
    assert [e["type"] for e in entries].count("append") >= 2  # saved as it went, not once
    [final] = [e for e in replayed_messages(read_entries(Path(path)))
               if e["message"]["role"] == "assistant"]
    assert final["id"] == partial["id"] == history[-1]["id"]
    assert final["meta"]["finish"] == "cancelled" and final["message"]["content"] == streamed


def test_a_client_that_leaves_mid_turn_frees_the_engine(server):
    c = ChatClient(server.base_url)
    c.hello()
    c.send("set_sampling", max_tokens=20000, logit_bias=no_eos(server.engine))
    c.until("settings")
    c.send("prompt", text="Go on and on")
    c.until("text_delta")
    c.close()
    assert idle(server)


def test_regenerate_edit_and_switch_build_a_tree(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_sampling", max_tokens=4, temperature=1.0, seed=1)
        c.until("settings")
        first = c.turn(text="Hi")[-1]["items"]
        again = c.turn("regenerate")[-1]["items"]
        assert again[0]["id"] == first[0]["id"] and again[1]["id"] != first[1]["id"]
        assert again[1]["siblings"] == {"index": 1, "count": 2,
                                        "ids": [first[1]["id"], again[1]["id"]]}
        sib = c.until("siblings")[-1]
        assert sib["entryId"] == again[1]["id"] and sib["count"] == 2 and sib["index"] == 1
        c.send("switch_sibling", entryId=first[1]["id"])
        back = c.until("history")[-1]["items"]
        assert [i["id"] for i in back] == [first[0]["id"], first[1]["id"]]
        edited = c.turn("edit_resend", text="Hello instead")[-1]["items"]
        assert edited[0]["content"] == "Hello instead" and edited[0]["parentId"] is None
        assert edited[0]["siblings"]["count"] == 2 and len(edited) == 2
        path = last(c, "sessions")["activePath"]
        c.send("fork_session", path=path)
        forked = c.until("sessions")[-1]
        assert forked["activePath"] != path
        assert [i["id"] for i in last(c, "history")["items"]] == [i["id"] for i in edited]
        c.send("delete_session", path=forked["activePath"])
        after = c.until("sessions")[-1]
        assert forked["activePath"] not in [s["path"] for s in after["items"]]
        assert after["activePath"] is None


def test_settings_travel_with_the_session_and_reach_the_engine(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_system_prompt", text="You are terse.")
        c.send("set_thinking", enabled=False)
        c.send("set_sampling", scope="session", max_tokens=3)
        c.send("set_sampling", scope="next_turn", max_tokens=2)
        settings = [c.until("settings")[-1] for _ in range(4)][-1]
        assert settings["nextTurn"] == {"max_tokens": 2}
        assert settings["sampling"] == {"max_tokens": 3}
        one = next(f for f in c.turn(text="a") if f["type"] == "turn_end")
        two = next(f for f in c.turn(text="b") if f["type"] == "turn_end")
        assert one["usage"]["completion_tokens"] <= 2 and two["usage"]["completion_tokens"] <= 3
        path = last(c, "sessions")["activePath"]
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("open_session", path=path)
        frames = c.until("context")
    opened = {f["type"]: f for f in frames}
    assert opened["settings"]["systemPrompt"] == "You are terse."
    assert opened["settings"]["thinking"] is False
    assert opened["settings"]["sampling"] == {"max_tokens": 3}
    assert [i["content"] for i in opened["history"]["items"] if i["role"] == "user"] == ["a", "b"]
    assert opened["context"]["tokens"] > 0


def test_client_mistakes_are_error_frames_and_the_socket_stays_usable(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        c.ws.send("not json")
        assert c.recv()["type"] == "error"
        for frame in ({"type": "nope"}, {"type": "set_sampling", "temperature": -1},
                      {"type": "set_sampling", "scope": "forever"}, {"type": "prompt", "text": 5},
                      {"type": "prompt", "text": "   "},
                      {"type": "open_session", "path": "../x.jsonl"},
                      {"type": "regenerate"}, {"type": "switch_sibling", "entryId": "m0"}):
            c.ws.send(json.dumps(frame))
            err = c.recv()
            assert err["type"] == "error" and err["status"] == 400, (frame, err)
        image = {"data": "aGVsbG8=", "mimeType": "image/png"}
        c.send("prompt", text="What is this?", images=[image])
        err = c.recv()
        assert err["type"] == "error" and "vision" in err["message"]
        c.send("list_sessions")
        assert c.until("sessions")[-1]["activePath"] is None  # the refused prompt saved nothing
        c.send("set_sampling", max_tokens=2)
        c.until("settings")
        items = c.turn(text="still here")[-1]["items"]
        assert [i["role"] for i in items] == ["user", "assistant"]


def test_a_malformed_entry_id_in_an_open_session_is_a_400(server):
    # an unhashable entryId once reached a dict lookup: a 500 for a client's mistake
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_sampling", max_tokens=2)
        c.until("settings")
        c.turn(text="Hi")
        for entry_id in ([1], {"id": "x"}):
            c.send("switch_sibling", entryId=entry_id)
            err = c.until("error")[-1]
            assert err["status"] == 400 and "entryId" in err["message"], (entry_id, err)


# a valid value for every field a frame must carry, so the field under test is the only
# thing wrong with it
REQUIRED_OK = {"text": "hi", "callId": "call_1", "decision": "deny", "enabled": False,
               "policy": "stop", "path": "nope.jsonl", "entryId": "m0"}
WRONG = {str: ["x"], bool: "yes", dict: ["x"], list: "x"}


def wrong_frames():
    """One frame per (type, field): that field of a wrong type, the rest valid."""
    for kind, fields in frames.FIELDS.items():
        base = {"type": kind, **{k: REQUIRED_OK[k] for k in frames.REQUIRED.get(kind, ())}}
        for name, types in fields.items():
            if types is frames.ANY:
                continue
            yield {**base, name: WRONG[types[0]]}, name


def test_every_frame_type_has_its_fields_checked(server):
    from mlxbun_core.webchat.agent import ChatAgent

    agent = ChatAgent(server.engine, web_state(server.server.config.app).sessions, None, {})
    assert set(agent.handlers) == set(frames.FIELDS)  # a new handler needs its row


def test_a_wrong_typed_field_of_any_frame_is_a_400_and_no_traceback(server, caplog):
    with ChatClient(server.base_url) as c, caplog.at_level(logging.INFO):
        c.hello()
        c.send("set_sampling", max_tokens=2)
        c.until("settings")
        c.turn(text="Hi")  # an open session: fork_session reaches the store with it
        c.send_frame({"type": "fork_session", "entryId": ["x"]})
        err = c.until("error")[-1]
        assert err["status"] == 400 and "fork_session.entryId" in err["message"], err
        sent = list(wrong_frames())
        for frame, name in sent:
            c.send_frame(frame)
            err = c.until("error")[-1]
            assert err["status"] == 400 and f"{frame['type']}.{name}" in err["message"], \
                (frame, err)
        assert len(sent) >= 20  # every typed field of every frame
        c.send_frame(["not", "an", "object"])
        assert c.until("error")[-1]["status"] == 400
        items = c.turn(text="still here")[-1]["items"]
        assert [i["role"] for i in items][-2:] == ["user", "assistant"]
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not failed, [r.getMessage() for r in failed]


def test_sessions_survive_a_restart_and_search_finds_them(tmp_path):
    model = tiny_checkpoint("qwen3")
    first = start_server(model, sessions_dir=tmp_path)
    try:
        with ChatClient(first.base_url) as c:
            c.hello()
            c.send("set_sampling", max_tokens=3)
            c.until("settings")
            items = c.turn(text="Tell me about the ZanziBar archipelago")[-1]["items"]
            path = last(c, "sessions")["activePath"]
    finally:
        first.stop()
    # a crash mid-write leaves a torn last line: it is skipped, never fatal
    with open(path, "a") as f:
        f.write('{"type": "message", "id": "torn", "mess')
    second = start_server(model, sessions_dir=tmp_path)
    try:
        with ChatClient(second.base_url) as c:
            listed = c.hello()["sessions"]["items"]
            assert [s["path"] for s in listed] == [path]
            assert listed[0]["title"] == "Tell me about the ZanziBar archipelago"
            c.send("open_session", path=path)
            history = c.until("history")[-1]["items"]
            assert [i["id"] for i in history] == [i["id"] for i in items]
            c.send("set_sampling", max_tokens=2)
            more = c.turn(text="And its history?")[-1]["items"]
            assert len(more) == 4 and more[2]["parentId"] == items[1]["id"]
        r = httpx.get(second.base_url + "/api/sessions/search", params={"q": "zanzibar"})
        assert r.status_code == 200 and r.json()["ok"] is True
        [hit] = r.json()["results"]
        assert hit["sessionPath"] == path and hit["sessionTitle"].startswith("Tell me about")
        [match] = hit["matches"]
        (start, end), = match["ranges"]
        assert match["snippet"][start:end] == "ZanziBar" and match["role"] == "user"
        assert httpx.get(second.base_url + "/api/sessions/search").json() == {
            "ok": False, "error": "q is required"}
        exported = httpx.get(second.base_url + "/api/sessions/export", params={"path": path}).json()
        kinds = [e["type"] for e in exported["entries"]]
        assert exported["ok"] and kinds[0] == "session" and kinds.count("message") == 4
    finally:
        second.stop()


def test_export_refuses_paths_outside_the_sessions_directory(server, tmp_path):
    root = web_state(server.server.config.app).sessions.root
    root.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "secret.jsonl"
    outside.write_text('{"type": "session", "id": "x"}\n')
    (root / "link.jsonl").symlink_to(outside)
    export = server.base_url + "/api/sessions/export"
    for path in ("../secret.jsonl", str(outside), str(root / ".." / "secret.jsonl"), "link.jsonl",
                 "/etc/passwd", str(root)):
        r = httpx.get(export, params={"path": path})
        assert r.status_code == 400 and r.json()["ok"] is False, path
    assert httpx.get(export).status_code == 400
    assert httpx.get(export, params={"path": "missing.jsonl"}).status_code == 404


def test_upgrade_required_and_unavailable_under_isolation(server):
    r = httpx.get(server.base_url + "/ws/chat")
    assert r.status_code == 426 and r.headers["upgrade"] == "websocket"
    app = server.server.config.app
    ws_chat.refuse(app)
    try:
        assert httpx.get(server.base_url + "/ws/chat").status_code == 501
        with pytest.raises(InvalidStatus) as refused:
            ChatClient(server.base_url)
        assert refused.value.response.status_code == 501
        assert b"--isolate" in refused.value.response.body
    finally:
        web_state(app).chat_unavailable = None


def test_the_api_key_guards_the_socket(tmp_path):
    s = start_server(tiny_checkpoint("qwen3"), api_key="sekrit", sessions_dir=tmp_path)
    try:
        with pytest.raises(InvalidStatus) as refused:
            ChatClient(s.base_url)
        assert refused.value.response.status_code == 401
        with pytest.raises(InvalidStatus):
            ChatClient(s.base_url, api_key="wrong")
        with ChatClient(s.base_url, api_key="sekrit") as c:
            assert c.hello()["ready"]["model"] == s.engine.model.id
        assert httpx.get(s.base_url + "/").status_code == 200  # the shell itself is open
        assert httpx.get(s.base_url + "/api/sessions/search", params={"q": "x"}).status_code == 401
    finally:
        s.stop()


def test_remote_clients_are_refused_without_a_key(tmp_path):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # routing only: an address of ours that is not loopback
        ip = probe.getsockname()[0]
    s = start_server(tiny_checkpoint("qwen3"), host="0.0.0.0", sessions_dir=tmp_path)
    try:
        with pytest.raises(InvalidStatus) as refused:
            ChatClient(f"http://{ip}:{s.port}")
        assert refused.value.response.status_code == 403
        assert b"loopback" in refused.value.response.body
        assert httpx.get(f"http://{ip}:{s.port}/").status_code == 200  # the page itself is public
        with ChatClient(s.base_url) as c:  # loopback is welcome
            assert c.hello()["ready"]
    finally:
        s.stop()


def test_images_reach_a_vision_model_as_image_url_parts(tmp_path):
    import base64

    import openai

    from mlxbun_core.testing import media
    from mlxbun_core.testing.vision import QWEN_VL_TEMPLATE
    from mlxbun_core.webchat.apptools import AGENT_TOOLS as TOOLS

    ckpt = tiny_checkpoint("qwen3_vl", seed=4, vision=True, chat_template=QWEN_VL_TEMPLATE)
    png = media.image_bytes("PNG", size=(64, 48), seed=3)
    s = start_server(ckpt, sessions_dir=tmp_path)
    try:
        with ChatClient(s.base_url) as c:
            assert c.hello()["ready"]["vision"] is True
            c.send("set_sampling", max_tokens=6)
            c.until("settings")
            frames = c.turn(text="Describe.", images=[
                {"data": base64.b64encode(png).decode(), "mimeType": "image/png"}])
        end = next(f for f in frames if f["type"] == "turn_end")
        assert end["lane"] == "serial"  # media requests run on the serial lane
        user = frames[-1]["items"][0]
        assert user["images"] == [media.data_url(png, "image/png")]
        # the same parts over the OpenAI API give the same greedy answer
        api = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        r = api.chat.completions.create(model="m", max_tokens=6, tools=TOOLS, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Describe."}, {
                "type": "image_url", "image_url": {"url": media.data_url(png, "image/png")}}]}])
        streamed = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
        assert r.choices[0].message.content == streamed == frames[-1]["items"][1]["content"]
        assert r.usage.prompt_tokens == end["usage"]["prompt_tokens"]
    finally:
        s.stop()


def test_set_adapter_answers_with_the_mounted_adapter(tmp_path, monkeypatch):
    import openai

    from mlxbun_core.testing.adapters import write_lora_adapter
    from mlxbun_core.webchat.apptools import AGENT_TOOLS as TOOLS

    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path / "home"))
    ckpt = tiny_checkpoint("llama")
    adapter = write_lora_adapter(ckpt, tmp_path / "home" / "adapters" / "a", seed=1)
    s = start_server(ckpt, sessions_dir=tmp_path / "sessions")
    try:
        r = httpx.post(s.v1 + "/adapters", json={"id": "a", "path": str(adapter)}, timeout=60)
        assert r.status_code == 200, r.text
        api = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Tell me a story"}]

        def ask(**extra):
            return api.chat.completions.create(model="m", max_tokens=8, tools=TOOLS,
                                               messages=messages, extra_body=extra)
        with ChatClient(s.base_url) as c:
            c.hello()
            c.send("set_sampling", max_tokens=8)
            c.send("set_adapter", id="a")
            assert c.until("settings")[-1]["adapter"] is None
            assert c.until("settings")[-1]["adapter"] == "a"
            frames = c.turn(text="Tell me a story")
            answer = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
            c.send("set_adapter", id="nope")
            c.until("settings")
            c.send("prompt", text="again")
            assert c.until("error")[-1]["status"] in (400, 404)
        with_adapter, base = ask(adapter="a"), ask()
        assert with_adapter.choices[0].message.content == answer
        assert base.choices[0].message.content != answer  # the adapter changed the answer
    finally:
        s.stop()
