"""The memory vault through a real server: ``/api/memory/*`` and the synthesis SSE stream
(httpx), synthesis over real session files by a scripted model (exact JSON answers) and by
the same random weights left free (answers that must still parse), the chat agent's
``memory_search`` tool over the real WebSocket, bad input, and remote clients refused."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx
import pytest

from mlxbun_core import plugins
from mlxbun_core.memory.vault import Vault
from mlxbun_core.server.guard import LOOPBACK_ONLY
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webchat.store import SessionStore
from scripted_model import scripted_checkpoint_plugin

TOPICS = {
    "kiwi": {"title": "Kiwi fruit", "summary": "A fuzzy brown fruit.",
             "facts": ["Kiwis are rich in vitamin C"], "related": ["Vitamin C"]},
    "rust": {"title": "Rust language", "summary": "A systems language.",
             "facts": ["Rust has a borrow checker"], "related": []},
}


def synthesis_answer(prompt: str) -> str:
    """What the scripted model answers a synthesis prompt: the topics its chunk mentions."""
    chunk = prompt.rsplit("<|im_start|>user", 1)[-1].lower()
    topics = [t for key, t in TOPICS.items() if key in chunk]
    return json.dumps({"topics": topics})


def chat_answer(prompt: str) -> str:
    tail = prompt.rsplit("<|im_start|>user", 1)[-1]
    if "tool_response" in tail or '"hits"' in tail:
        return "Kiwis are rich in vitamin C."
    return '<tool_call>{"name": "memory_search", "arguments": {"query": "vitamin"}}</tool_call>'


def reply(prompt: str) -> str:
    return synthesis_answer(prompt) if "personal wiki" in prompt else chat_answer(prompt)


def outward_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only, nothing leaves
        return s.getsockname()[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One scripted server for the module, on every interface, with its own vault root
    (``MLXBUN_WIKI``) and sessions folder."""
    root = tmp_path_factory.mktemp("memory")
    old = os.environ.get("MLXBUN_WIKI")
    os.environ["MLXBUN_WIKI"] = str(root / "wiki")
    plugin = scripted_checkpoint_plugin()
    plugins.register(plugin, "scripted-memory")
    srv = start_server(plugin.path, batch=1, host="0.0.0.0", sessions_dir=root / "sessions")
    try:
        yield srv, plugin, SessionStore(root / "sessions"), Vault(root / "wiki")
    finally:
        srv.stop()
        plugins.unregister("scripted-memory")
        if old is None:
            os.environ.pop("MLXBUN_WIKI", None)
        else:
            os.environ["MLXBUN_WIKI"] = old


def get(srv, path: str, **params) -> tuple[int, dict]:
    r = httpx.get(srv.base_url + path, params=params, timeout=30)
    return r.status_code, r.json()


def synthesize(srv, **params) -> list:
    """The stream's events, ``[DONE]`` as the string."""
    events = []
    with httpx.stream("GET", srv.base_url + "/v1/memory/synthesize", params=params,
                      timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chat(store: SessionStore, *turns: str) -> None:
    session = store.create()
    parent = None
    for i, text in enumerate(turns):
        parent = session.add_message({"role": "user" if i % 2 == 0 else "assistant",
                                      "content": text}, parent)["id"]


def test_1_every_route_says_there_is_no_vault_yet(served):
    """The routes over the whole vault answer 200 with empty results (the Memory page
    shows that state); those about one article, and synthesis, a 404."""
    srv, _, _, vault = served
    absent = {"ok": True, "enabled": False, "root": str(vault.root),
              "message": "no memory vault yet"}
    assert get(srv, "/api/memory/status") == (200, {**absent, "status": None})
    assert get(srv, "/api/memory/list") == (200, {**absent, "articles": [], "reference": []})
    assert get(srv, "/api/memory/search", q="x") == (200, {**absent, "summaries": [], "hits": []})
    assert get(srv, "/api/memory/search")[0] == 400  # bad input is still a 400
    assert get(srv, "/api/memory/article", name="Kiwi_fruit") == (404, {
        "ok": False, "enabled": False, "error": "no memory vault yet", "root": str(vault.root)})
    assert get(srv, "/v1/memory/synthesize")[1]["enabled"] is False
    assert not vault.root.exists()


def test_2_init_creates_the_vault_once(served, tmp_path):
    srv, *_, vault = served
    r = httpx.post(srv.base_url + "/api/memory/init", timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["ok"] and body["result"]["root"] == str(vault.root)
    assert not body["result"]["alreadySetUp"] and "articles/" in body["result"]["created"]
    assert body["status"]["articleCount"] == 0 and vault.exists
    again = httpx.post(srv.base_url + "/api/memory/init", json={}, timeout=30).json()
    assert again["result"]["alreadySetUp"] and again["result"]["created"] == []
    elsewhere = httpx.post(srv.base_url + "/api/memory/init",
                           json={"path": str(tmp_path / "other")}, timeout=30).json()
    assert elsewhere["result"]["root"] == str(tmp_path / "other")
    assert (tmp_path / "other" / "articles").is_dir()
    status, body = get(srv, "/api/memory/status")
    assert status == 200 and body["enabled"] and body["status"]["root"] == str(vault.root)
    assert body["status"]["sessionsCovered"] == 0 and body["status"]["lastSynthesisMs"] is None


def test_3_a_dry_run_plans_without_writing(served):
    srv, plugin, store, vault = served
    chat(store, "Tell me about the kiwi fruit.", "It is fuzzy.")
    chat(store, "Why does rust have a borrow checker?", "For memory safety.")
    asked = len(plugin.prompts)
    events = synthesize(srv, dry="1")
    assert events[-1] == "[DONE]" and events[-2]["type"] == "summary"
    stages = [e["stage"] for e in events if isinstance(e, dict) and e["type"] == "stage"]
    assert stages == events[-2]["stages"] and stages[0] == "ingest"
    assert events[0]["message"].startswith("2 conversations to read")
    plans = [e["message"] for e in events if isinstance(e, dict) and e["type"] == "log"]
    assert len(plans) == 2 and all(p.startswith("would extract") for p in plans)
    assert "nothing written" in events[-3]["message"]
    assert len(plugin.prompts) == asked  # no model call
    assert vault.article_names() == [] and vault.history.source_digest("x") is None


def test_4_a_run_writes_articles_the_index_finds(served):
    srv, plugin, store, vault = served
    plugin.reply = reply
    events = synthesize(srv)
    assert events[-1] == "[DONE]", events
    done = next(e for e in events if isinstance(e, dict) and e["type"] == "done")
    assert sorted(done["created"]) == ["Kiwi_fruit", "Rust_language"]
    status, listing = get(srv, "/api/memory/list")
    assert listing["articles"] == ["Kiwi_fruit", "Rust_language"]
    state = get(srv, "/api/memory/status")[1]["status"]  # what the Memory page shows
    assert state["sessionsCovered"] == 2 and state["indexBytes"] > 0
    assert abs(state["lastSynthesisMs"] / 1000 - time.time()) < 60
    _, found = get(srv, "/api/memory/search", q="vitamin", scope="articles")
    assert found["summaries"][0]["article"] == "Kiwi_fruit"
    hit = found["hits"][0]
    assert hit["anchor"] == "facts" and "rich in vitamin C" in hit["excerpt"]
    _, page = get(srv, "/api/memory/article", name="Kiwi_fruit")
    assert page["content"].splitlines()[hit["line"] - 1].startswith("- Kiwis are rich")
    assert page["lead"] == "A fuzzy brown fruit." and page["series"] is None
    _, links = get(srv, "/api/memory/links", name="Kiwi_fruit")
    assert links["outbound"] == ["Vitamin_C"] and links["inbound"] == []
    _, history = get(srv, "/api/memory/history", name="Kiwi_fruit")
    assert [e["subject"] for e in history["entries"]] == [
        "synthesis: see also", "synthesis: create from 'Tell me about the kiwi fruit.'"]
    _, diff = get(srv, "/api/memory/diff", name="Kiwi_fruit", rev=history["entries"][0]["hash"])
    assert "+## See also" in diff["diff"] and "+- [[Vitamin_C]]" in diff["diff"]
    # a second run reads nothing new; a changed chat patches its article
    again = synthesize(srv)
    assert again[0]["message"].startswith("0 conversations to read, 2 unchanged")
    chat(store, "More on kiwi: they grow on vines.")
    TOPICS["kiwi"]["facts"].append("Kiwis grow on vines")
    done = next(e for e in synthesize(srv) if isinstance(e, dict) and e["type"] == "done")
    assert done["created"] == [] and done["patched"] == ["Kiwi_fruit"]
    assert "- Kiwis grow on vines" in vault.read("Kiwi_fruit")


def test_5_random_weights_still_answer_in_the_schema(served):
    srv, plugin, _, vault = served
    plugin.reply, plugin.text, plugin.free_after = None, "", True
    try:
        events = synthesize(srv, force="1")
    finally:
        plugin.free_after = False
    assert events[-1] == "[DONE]", events
    extracts = [e["message"] for e in events if isinstance(e, dict) and e["type"] == "log"]
    assert len(extracts) == 3 and all(" topics, " in m for m in extracts), extracts


def test_6_the_chat_agent_consults_the_vault(served):
    srv, plugin, *_ = served
    plugin.reply = reply
    with ChatClient(srv.base_url) as c:
        c.hello()
        frames = c.turn(text="What do you remember about vitamins?")
    start = next(f for f in frames if f["type"] == "tool_start")
    assert start["tool"] == "memory_search"
    end = next(f for f in frames if f["type"] == "tool_end")
    assert end["ok"] and end["result"]["articles"][0] == "Kiwi_fruit"
    assert any("vitamin C" in h["excerpt"] for h in end["result"]["hits"])
    answer = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
    assert answer.endswith("Kiwis are rich in vitamin C.")


@pytest.mark.parametrize("path,params,status", [
    ("/api/memory/search", {}, 400),
    ("/api/memory/search", {"q": "x", "scope": "everything"}, 400),
    ("/api/memory/search", {"q": "x", "limit": "-3"}, 400),
    ("/api/memory/search", {"q": "x" * 600}, 400),
    ("/api/memory/article", {"name": "../../etc/passwd"}, 400),
    ("/api/memory/article", {"name": "Nope"}, 404),
    ("/api/memory/links", {}, 400),
    ("/api/memory/history", {"name": "Nope"}, 404),
    ("/api/memory/diff", {"name": "Kiwi_fruit", "rev": "HEAD~1"}, 400),
    ("/api/memory/diff", {"name": "Kiwi_fruit", "rev": "deadbeef"}, 404),
    ("/v1/memory/synthesize", {"dry": "perhaps"}, 400),
])
def test_7_bad_input_gets_a_4xx(served, path, params, status):
    got, body = get(served[0], path, **params)
    assert got == status and body["ok"] is False and body["error"]


def test_7_bad_init_bodies_get_a_400(served):
    srv = served[0]
    for content in (b"[1]", b"{not json", json.dumps({"path": "/etc"}).encode(),
                    json.dumps({"path": 7}).encode()):
        r = httpx.post(srv.base_url + "/api/memory/init", content=content,
                       headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400 and r.json()["ok"] is False, content
    assert get(srv, "/api/memory/status")[0] == 200  # nothing harmed


def test_8_remote_clients_are_refused(served):
    srv = served[0]
    remote = f"http://{outward_ip()}:{srv.port}"
    forbidden = {"error": {"message": LOOPBACK_ONLY, "type": "permission_error"}}
    for method, path in (("GET", "/api/memory/status"), ("GET", "/api/memory/search?q=kiwi"),
                         ("POST", "/api/memory/init"), ("GET", "/v1/memory/synthesize?dry=1")):
        r = httpx.request(method, remote + path, timeout=30)
        assert (r.status_code, r.json()) == (403, forbidden), path


def test_9_one_run_at_a_time_and_a_closed_stream_cancels_it(served):
    srv, plugin, store, _ = served
    plugin.reply, plugin.text, plugin.free_after = None, "", True
    asked = len(plugin.prompts)
    try:
        with httpx.stream("GET", srv.base_url + "/v1/memory/synthesize",
                          params={"force": "1"}, timeout=60) as r:
            lines = r.iter_lines()
            while "extract" not in next(lines):  # the first generation is under way
                pass
            busy = httpx.get(srv.base_url + "/v1/memory/synthesize", params={"dry": "1"})
            assert (busy.status_code, busy.json()) == (
                409, {"ok": False, "error": "a synthesis is running"})
        deadline = time.monotonic() + 20
        while srv.engine.stats()["active"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.engine.stats()["active"] == 0
        time.sleep(1.5)  # time for a second chunk's generation, were the run still going
        assert len(store.files()) >= 4 and len(plugin.prompts) == asked + 1
        assert synthesize(srv, dry="1")[-1] == "[DONE]"  # the next run is welcome
    finally:
        plugin.free_after = False
