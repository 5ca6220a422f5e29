"""Session files on disk: the tree they replay into, torn lines, byte caps, path rules, search."""

from __future__ import annotations

import json

import pytest

from mlxbun_core.errors import BadRequest, NotFound
from mlxbun_core.webchat import apptools
from mlxbun_core.webchat.search import search
from mlxbun_core.webchat.store import (
    SessionStore,
    StoreFull,
    compacted,
    read_entries,
    replayed_messages,
)


def chat(store, *pairs):
    s = store.create()
    parent = None
    for user, answer in pairs:
        parent = s.add_message({"role": "user", "content": user}, parent)["id"]
        parent = s.add_message({"role": "assistant", "content": answer}, parent)["id"]
    return s


def test_a_session_replays_into_its_tree(tmp_path):
    store = SessionStore(tmp_path)
    s = chat(store, ("hi", "hello"))
    user, first = (e["id"] for e in s.branch())
    second = s.add_message({"role": "assistant", "content": "hey"}, user)
    s.update_settings({"systemPrompt": "be brief"})
    s.set_leaf(first)
    again = store.open(str(s.path))
    assert [e["message"]["content"] for e in again.branch()] == ["hi", "hello"]
    assert again.siblings(first) == [first, second["id"]]
    assert again.newest_leaf_under(user) == second["id"]
    assert again.settings == {"systemPrompt": "be brief"} and again.title == "hi"
    with pytest.raises(NotFound):
        again.set_leaf("m-nope")


def test_a_torn_last_line_is_skipped_and_the_next_write_starts_a_new_line(tmp_path):
    store = SessionStore(tmp_path)
    s = chat(store, ("one", "two"))
    with open(s.path, "ab") as f:
        f.write(b'{"type": "message", "id": "x", "message": {"role": "us')
    again = store.open(s.path.name)
    assert [e["message"]["content"] for e in again.branch()] == ["one", "two"]
    again.add_message({"role": "user", "content": "three"}, again.leaf)
    lines = s.path.read_bytes().splitlines()
    assert json.loads(lines[-1])["message"]["content"] == "three"
    # header, two messages, the new one; the torn line dropped
    assert len(read_entries(s.path)) == 4
    branch = store.open(s.path.name).branch()
    assert [e["message"]["content"] for e in branch] == ["one", "two", "three"]


def test_an_answer_saved_as_it_streams_replays_whole_and_survives_a_torn_append(tmp_path):
    """A partial answer is a marked message plus appends; its finished version replaces
    it in place (one message in the tree, in search, in an export)."""
    store = SessionStore(tmp_path)
    s = chat(store, ("hi", "hello"))
    user = s.add_message({"role": "user", "content": "tell a tale"}, s.leaf)["id"]
    draft = s.add_message({"role": "assistant", "content": "Once"}, user, {"finish": "interrupted"})
    s.append_text(draft["id"], " upon", "thinking")
    s.append_text(draft["id"], " a time")
    crashed = store.open(s.path.name)  # what a restart after a crash reads
    answer = crashed.branch()[-1]
    assert answer["id"] == draft["id"] and answer["meta"] == {"finish": "interrupted"}
    assert answer["message"] == {"role": "assistant", "content": "Once upon a time",
                                 "reasoning_content": "thinking"}
    with open(s.path, "ab") as f:  # killed mid-append: the torn line loses only its own text
        f.write(b'{"type": "append", "id": "' + draft["id"].encode() + b'", "content": " th')
    assert store.open(s.path.name).branch()[-1]["message"]["content"] == "Once upon a time"
    s.replace_message(draft["id"], {"role": "assistant", "content": "Once upon a time, the end."},
                      {"finish": "stop"})
    done = store.open(s.path.name)
    assert [e["id"] for e in done.branch()] == [e["id"] for e in s.branch()]
    assert done.branch()[-1]["message"]["content"] == "Once upon a time, the end."
    assert done.branch()[-1]["meta"] == {"finish": "stop"} and done.children[user] == [draft["id"]]
    assert len(replayed_messages(read_entries(s.path))) == 4
    [hit] = search(store, "upon a time")
    assert len(hit["matches"]) == 1 and hit["matches"][0]["entryId"] == draft["id"]
    exported = compacted(read_entries(s.path))
    assert [e["type"] for e in exported] == ["session"] + ["message"] * 4
    assert exported[-1]["message"]["content"] == "Once upon a time, the end."
    assert store.summaries()[0]["messages"] == 4


def test_byte_caps_refuse_writes_with_a_clear_error(tmp_path):
    store = SessionStore(tmp_path, max_file_bytes=600)
    s = store.create()
    with pytest.raises(StoreFull, match="session is full"):
        s.add_message({"role": "user", "content": "x" * 700}, None)
    assert s.messages == {}  # nothing half-written
    small = SessionStore(tmp_path, max_bytes=s.path.stat().st_size + 10)
    with pytest.raises(StoreFull, match="directory is full"):
        small.create()


def test_paths_must_stay_inside_the_directory(tmp_path):
    root = tmp_path / "sessions"
    store = SessionStore(root)
    s = store.create()
    assert store.resolve(s.path.name) == s.path.resolve() == store.resolve(str(s.path))
    (tmp_path / "elsewhere.jsonl").write_text("{}\n")
    (root / "out.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    for bad in ("", "../elsewhere.jsonl", str(tmp_path / "elsewhere.jsonl"), "out.jsonl",
                "notes.txt", "a/../../elsewhere.jsonl", None, 5):
        with pytest.raises(BadRequest):
            store.resolve(bad)
    with pytest.raises(NotFound):
        store.resolve("missing.jsonl")
    assert [p.name for p in store.files()] == [s.path.name]  # the symlink is not a session


def test_fork_copies_the_active_branch_and_delete_removes_the_file(tmp_path):
    store = SessionStore(tmp_path)
    s = chat(store, ("a", "b"), ("c", "d"))
    s.update_settings({"thinking": True})
    fork = store.fork(str(s.path))
    assert fork.path != s.path and fork.header["forkedFrom"] == str(s.path)
    assert [e["id"] for e in fork.branch()] == [e["id"] for e in s.branch()]
    assert fork.settings == {"thinking": True}
    store.delete(fork.path.name)
    assert not fork.path.exists() and [p.name for p in store.files()] == [s.path.name]


def test_search_is_case_insensitive_with_ranges_into_the_snippet_and_capped(tmp_path):
    store = SessionStore(tmp_path)
    long = "word " * 40 + "the Needle is here" + " word" * 40
    chat(store, ("find the NEEDLE please", long))
    for _ in range(8):
        chat(store, *[(f"needle {i}", "a needle, and another needle") for i in range(8)])
    results = search(store, "needle")
    assert sum(len(r["matches"]) for r in results) == 50
    assert all(len(r["matches"]) <= 10 for r in results)
    for r in results:
        for m in r["matches"]:
            assert m["ranges"]
            assert all(m["snippet"][a:b].lower() == "needle" for a, b in m["ranges"])
    [hit] = search(store, "NEEDLE IS HERE")
    [m] = hit["matches"]
    assert m["role"] == "assistant" and len(m["snippet"]) == len("the Needle is here") - 4 + 120
    (a, b), = m["ranges"]
    assert m["snippet"][a:b] == "Needle is here" and a == 60
    assert search(store, "absent") == []


def test_app_tools_validate_against_the_route_catalog():
    assert {t["function"]["name"] for t in apptools.TOOLS} == {
        "get_current_app_context", "navigate_app", "spotlight_ui"}
    result, frame = apptools.run_tool("navigate_app", {"route": "status"}, None)
    assert frame == {"type": "ui_navigate", "route": "status"}
    _, frame = apptools.run_tool("navigate_app", {"route": "quantize"}, None)  # a lab page
    assert frame == {"type": "ui_navigate", "route": "quantize"}
    with pytest.raises(apptools.ToolFailed, match="unknown route"):
        apptools.run_tool("navigate_app", {"route": "wiki"}, None)
    _, frame = apptools.run_tool("spotlight_ui", {"target": "send", "message": "here"}, None)
    assert frame == {"type": "ui_spotlight", "target": "send", "message": "here"}
    with pytest.raises(apptools.ToolFailed):
        apptools.run_tool("spotlight_ui", {"message": "nothing to point at"}, None)
    context = apptools.clean_context({"route": "status", "snapshot": {
        "elements": [{"ref": f"e{i}", "label": "x" * 500} for i in range(500)]}})
    assert len(context["snapshot"]["elements"]) == apptools.MAX_ELEMENTS
    assert len(context["snapshot"]["elements"][0]["label"]) == apptools.MAX_FIELD_CHARS
    assert apptools.run_tool("get_current_app_context", {}, context)[0] is context
    assert apptools.ambient_line(context) == "[user is on: Status]"
    assert apptools.clean_context({"snapshot": {}}) is None
