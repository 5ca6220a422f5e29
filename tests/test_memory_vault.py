"""The memory vault on real files: articles, revisions and diffs in SQLite, the FTS5 index
and its byte cap, the transcript chunks synthesis reads, and the ``mlxbun memory`` command.
No model here (tests/test_memory_server.py runs synthesis through a real server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mlxbun_core.errors import BadRequest, NotFound
from mlxbun_core.memory import articles
from mlxbun_core.memory.history import History
from mlxbun_core.memory.synthesis import Conversation, parse_topics
from mlxbun_core.memory.vault import NoVault, Vault
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.webchat import apptools
from mlxbun_core.webchat.memory import run_tool, saved_conversations
from mlxbun_core.webchat.store import SessionStore

KIWI = articles.render("Kiwi fruit", "A fuzzy fruit.", ["Rich in vitamin C"], ["Rust_language"])


@pytest.fixture
def vault(tmp_path):
    v = Vault(tmp_path / "wiki")
    v.setup()
    return v


def test_setup_is_idempotent_and_never_overwrites(tmp_path):
    v = Vault(tmp_path / "wiki")
    with pytest.raises(NoVault):
        v.require()
    first = v.setup()
    assert not first.alreadySetUp and "README.md" in first.created and "articles/" in first.created
    (v.root / "README.md").write_text("mine")
    again = v.setup()
    assert again.alreadySetUp and again.created == []
    assert (v.root / "README.md").read_text() == "mine"
    status = v.status()
    assert status["exists"] and status["articleCount"] == 0 and status["referenceCount"] == 1


def test_articles_links_history_and_diff(vault):
    first = vault.write("Kiwi_fruit", KIWI, "create")
    vault.write("Rust_language", articles.render("Rust", "A language.", [], ["Kiwi fruit"]), "c")
    second = vault.write("Kiwi_fruit", articles.add_bullets(KIWI, "Facts", ["Grows on vines"]),
                         "add a fact")
    assert vault.write("Kiwi_fruit", vault.read("Kiwi_fruit"), "same") is None  # no change
    assert vault.article_names() == ["Kiwi_fruit", "Rust_language"]
    page = vault.article("Kiwi_fruit")
    assert page["lead"] == "A fuzzy fruit."
    assert [s["anchor"] for s in page["structure"]] == ["kiwi-fruit", "facts", "see-also"]
    assert vault.links("Kiwi_fruit") == {"name": "Kiwi_fruit", "outbound": ["Rust_language"],
                                         "inbound": ["Rust_language"]}
    log = vault.log("Kiwi_fruit", 50)
    assert [e["hash"] for e in log] == [second, first]
    assert [e["subject"] for e in log] == ["add a fact", "create"]
    diff = vault.diff("Kiwi_fruit", second[:8])
    assert diff.startswith("diff --git a/articles/Kiwi_fruit.md b/articles/Kiwi_fruit.md\n")
    assert "\n+- Grows on vines\n" in diff and "\n-" not in diff.split("+++", 1)[1]
    created = vault.diff("Kiwi_fruit", first)
    assert "--- /dev/null" in created and "+# Kiwi fruit" in created
    with pytest.raises(NotFound):
        vault.diff("Rust_language", second)  # a revision of another article
    with pytest.raises(BadRequest):
        vault.read("../README")
    with pytest.raises(NotFound):
        vault.read("Nope")


def test_search_ranks_articles_and_points_at_lines(vault):
    vault.write("Kiwi_fruit", KIWI, "create")
    vault.write("Lemon", articles.render("Lemon", "Sour.", ["Has vitamin C too"], []), "c")
    found = vault.search("kiwi vitamin")
    assert [s["article"] for s in found["summaries"]] == ["Kiwi_fruit", "Lemon"]
    assert found["summaries"][0]["matched_terms"] == ["kiwi", "vitamin"]
    hit = next(h for h in found["hits"] if "vitamin" in h["excerpt"])
    assert hit["article"] == "Kiwi_fruit" and hit["anchor"] == "facts"
    assert vault.read("Kiwi_fruit").splitlines()[hit["line"] - 1].endswith("vitamin C")
    assert vault.search("vitamins")["summaries"]  # stemmed
    assert [s["article"] for s in vault.search("sour", scope="reference")["summaries"]] == []
    assert vault.search("synthesis", scope="reference")["summaries"][0]["article"] == \
        "Reference/mlxbun_memory"
    for hostile in ('"', "NEAR(a b)", "kiwi*", "a OR", "-", "col:kiwi", ""):
        vault.search(hostile)  # FTS5 syntax never reaches the engine: no error


def test_edits_made_outside_are_found_after_reindex(vault):
    (vault.articles_dir / "Notes.md").write_text("# Notes\n\nThe pangolin is scaly.\n")
    assert vault.search("pangolin")["summaries"] == []
    vault.reindex()
    assert vault.search("pangolin")["hits"][0]["article"] == "Notes"


def test_the_index_has_a_byte_cap(vault):
    vault.index.max_bytes = 64 << 10
    big = "\n".join(f"line {i} about aardvarks and {os.urandom(24).hex()}" for i in range(5000))
    assert vault.index.put("Big", "articles", big) is False
    assert vault.status()["indexIncomplete"] is True
    assert vault.index.path.stat().st_size <= 64 << 10
    assert vault.search("aardvarks")["summaries"] == []  # the failed write left nothing half done


def test_the_history_has_a_byte_cap(tmp_path):
    h = History(tmp_path / "h.sqlite", max_bytes=10_000)
    revs = [h.record("A", f"{i}" * 3000, f"r{i}") for i in range(6)]
    h.record("B", "b" * 100, "b")
    kept = [e["hash"] for e in h.log("A", 50)]
    assert kept[0] == revs[-1] and len(kept) < 6  # the oldest went, the latest stays
    assert h.log("B", 5)[0]["subject"] == "b"


def test_titles_become_safe_stems():
    assert articles.stem_of("Kiwi fruit") == "Kiwi_fruit"
    assert articles.stem_of("../../etc/passwd") == "etc_passwd"
    assert articles.stem_of("!!!") is None and articles.stem_of("") is None
    assert not articles.valid_stem("a/b") and not articles.valid_stem("..x")
    assert articles.outbound_links("[[Kiwi fruit|k]] and [[Rust#x]] [[Kiwi_fruit]]") == [
        "Kiwi_fruit", "Rust"]


def test_transcripts_are_cut_between_turns():
    conv = Conversation("c", "t", [("user", "a" * 50), ("assistant", "b" * 50),
                                   ("user", "c" * 130)])
    chunks = conv.chunks(100)
    assert all(len(c) <= 100 for c in chunks)
    assert chunks[0] == "User: " + "a" * 50 + "\n"
    assert "".join(chunks) == "".join(f"{r.capitalize()}: {t}\n" for r, t in conv.turns)
    with pytest.raises(ValueError):
        parse_topics('{"nope": 1}', "t")
    assert parse_topics('{"topics": [{"title": " A\\nB ", "summary": "", "facts": ["x"], '
                        '"related": []}]}', "t")[0].title == "A B"


def test_saved_sessions_become_conversations(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    s = store.create()
    q = s.add_message({"role": "user", "content": "first question"}, None)
    s.add_message({"role": "assistant", "content": "old answer"}, q["id"])
    s.add_message({"role": "assistant", "content": "regenerated answer"}, q["id"])
    store.create()  # an empty session is left out
    (conv,) = saved_conversations(store)
    assert conv.turns == [("user", "first question"), ("assistant", "regenerated answer")]
    assert conv.title == "first question"


def test_the_chat_tool_searches_the_vault(vault, monkeypatch):
    vault.write("Kiwi_fruit", KIWI, "create")
    monkeypatch.setenv("MLXBUN_WIKI", str(vault.root))
    assert "memory_search" in {t["function"]["name"] for t in apptools.AGENT_TOOLS}
    result, frame = apptools.run_tool("memory_search", {"query": "vitamin"}, None)
    assert frame is None and result["articles"] == ["Kiwi_fruit"]
    assert "vitamin C" in result["hits"][0]["excerpt"]
    with pytest.raises(apptools.ToolFailed, match="non-empty query"):
        apptools.run_tool("memory_search", {"query": 3}, None)
    monkeypatch.setenv("MLXBUN_WIKI", str(vault.root / "absent"))
    assert "no memory vault" in run_tool("memory_search", {"query": "x"})["note"]


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "memory", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_memory_command(tmp_path):
    env = {**os.environ, "MLXBUN_WIKI": str(tmp_path / "wiki")}
    missing = _cli("status", env=env)
    assert missing.returncode == 1 and "no memory vault yet" in missing.stderr
    init = _cli("init", env=env)
    assert init.returncode == 0 and json.loads(init.stdout)["created"]
    Vault(tmp_path / "wiki").write("Kiwi_fruit", KIWI, "create")
    found = _cli("search", "vitamin", env=env)
    assert json.loads(found.stdout)["summaries"][0]["article"] == "Kiwi_fruit"
    sessions = SessionStore(tmp_path / "sessions")
    sessions.create().add_message({"role": "user", "content": "tell me about kiwis"}, None)
    dry = _cli("synthesize", "--dry-run", "--sessions", str(tmp_path / "sessions"), env=env)
    assert dry.returncode == 0, dry.stderr
    assert "1 conversations to read" in dry.stdout and "would extract 'tell me about kiwis'" \
        in dry.stdout and "nothing written" in dry.stdout
    assert Vault(tmp_path / "wiki").article_names() == ["Kiwi_fruit"]
    run = _cli("synthesize", "--sessions", str(tmp_path / "sessions"),
               "--model", str(tiny_checkpoint("qwen3")), env=env)
    assert run.returncode == 0, run.stderr
    assert "stage: [wikify]" in run.stdout and "done: synthesis done" in run.stdout
    assert "did not parse" not in run.stdout
    assert "1 conversations marked read" in run.stdout
