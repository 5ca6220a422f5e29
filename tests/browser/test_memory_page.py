"""The Memory page (#memory) in headless Chromium against a real server: set the vault up,
preview synthesis, cancel a run, synthesize over real saved chats (one typed in the real
chat, one written through the session store) with live stage progress, search, open an
article and follow its wikilinks and backlinks, read its history and a revision's diff; the
keyboard and a phone-width screen. The model is scripted (exact JSON answers) so the
articles are known; everything else is the real path."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from mlxbun_core import plugins
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.webchat.store import SessionStore
from scripted_model import scripted_checkpoint_plugin

pytestmark = pytest.mark.browser

UNNAMED = """() => [...document.querySelectorAll(
    '#view-memory button, #view-memory input, #view-memory select, #view-memory a')]
    .filter(el => !(el.getAttribute('aria-label') || el.labels?.length || el.textContent.trim()))
    .map(el => el.outerHTML.slice(0, 80))"""
KIWI = {"title": "Kiwi fruit", "summary": "A fuzzy brown fruit with green flesh.",
        "facts": ["Kiwis are rich in vitamin C"], "related": ["Vitamin C"]}
RUST = {"title": "Rust language", "summary": "A systems programming language.",
        "facts": ["Rust has a borrow checker"], "related": []}


def reply(prompt: str, slow: list) -> str:
    """Synthesis prompts get the topics their chunk mentions; chat prompts a plain answer."""
    if "personal wiki" not in prompt:
        return "Kiwis are green inside and grow on vines."
    if slow:
        time.sleep(slow[0])
    chunk = prompt.rsplit("<|im_start|>user", 1)[-1].lower()
    return json.dumps({"topics": [t for key, t in (("kiwi", KIWI), ("rust", RUST))
                                  if key in chunk]})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    old = os.environ.get("MLXBUN_WIKI")
    os.environ["MLXBUN_WIKI"] = str(root / "wiki")
    plugin = scripted_checkpoint_plugin()
    plugins.register(plugin, "scripted-memory-page")
    slow: list = []
    plugin.reply = lambda prompt: reply(prompt, slow)
    srv = start_server(plugin.path, batch=1, sessions_dir=root / "sessions")
    try:
        yield srv, SessionStore(root / "sessions"), slow
    finally:
        srv.stop()
        plugins.unregister("scripted-memory-page")
        if old is None:
            os.environ.pop("MLXBUN_WIKI", None)
        else:
            os.environ["MLXBUN_WIKI"] = old


@pytest.fixture
def no_vault(tmp_path, monkeypatch):
    """A server whose vault root (``MLXBUN_WIKI``, read when the app is built) has no
    vault, and never gets one here."""
    monkeypatch.setenv("MLXBUN_WIKI", str(tmp_path / "wiki"))
    srv = start_server(tiny_checkpoint("qwen3"), max_tokens=4, sessions_dir=tmp_path / "s")
    monkeypatch.undo()
    yield srv, tmp_path / "wiki"
    srv.stop()


def test_before_a_vault_exists_the_page_asks_no_404(page, no_vault):
    """No vault yet is a state, not an error: the status and search routes answer 200
    saying so, the page offers to set one up, and its network log has no 4xx at all, on
    #memory, after a search and on an article's route."""
    srv, root = no_vault
    refused: list = []
    page.on("response", lambda r: refused.append((r.status, r.url)) if r.status >= 400 else None)
    page.goto(srv.base_url + "/#memory")
    page.wait_for_selector("#memory-init")
    assert str(root) in page.inner_text("#memory-status")
    assert "No memory vault yet" in page.inner_text("#memory-status")
    page.fill("#memory-q", "kiwi")
    page.keyboard.press("Enter")
    said = page.wait_for_selector("#memory-results p").inner_text()
    assert said == "No memory vault yet: set it up above, then search it."
    page.goto(srv.base_url + "/#memory/Kiwi_fruit")
    page.wait_for_selector("#memory-init")
    page.wait_for_timeout(500)  # an article request would have answered by now
    assert page.is_hidden("#memory-article-card")
    assert refused == [] and page.console.errors == []
    for path, extra in (("status", {"status": None}), ("list", {"articles": [], "reference": []}),
                        ("search?q=kiwi", {"summaries": [], "hits": []})):
        r = httpx.get(f"{srv.base_url}/api/memory/{path}")
        assert (r.status_code, r.json()) == (200, {"ok": True, "enabled": False, "root": str(root),
                                                   "message": "no memory vault yet", **extra})
    assert not root.exists()


def saved_chat(store: SessionStore, *turns: str) -> None:
    session = store.create()
    parent = None
    for i, text in enumerate(turns):
        parent = session.add_message({"role": "user" if i % 2 == 0 else "assistant",
                                      "content": text}, parent)["id"]


def status_row(page, name: str) -> str:
    return page.inner_text(f"#memory-kv tr:has(th:text-is('{name}')) td")


def synthesize(page, dry: bool) -> None:
    page.click("#memory-preview" if dry else "#memory-run")  # the note's kind resets at once
    page.wait_for_selector("#memory-synth-note[data-kind=done]", timeout=60_000)
    page.wait_for_function("() => document.getElementById('memory-cancel').disabled")


def real_errors(page, missing: list) -> list:
    """Console errors, and every 404 the page's requests got (none: before a vault exists
    its status route answers 200 saying so)."""
    return [*missing, *page.console.errors]


def test_set_up_synthesize_search_read_and_diff(page, served):
    srv, store, slow = served
    missing: list = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.goto(srv.base_url + "/#chat")  # one chat typed in the real chat
    page.wait_for_selector("#conn[data-state=open]")
    page.fill("#composer-input", "Tell me about the kiwi fruit and the rust language.")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant:not(.streaming)")
    saved_chat(store, "Is a kiwi rich in vitamin C?", "Yes, very.")  # one from the store

    page.click("a[data-route=memory]")
    page.wait_for_selector("#memory-init")
    assert "No memory vault yet" in page.inner_text("#memory-status")
    assert page.is_disabled("#memory-preview") and page.is_disabled("#memory-run")
    page.click("#memory-init")
    page.wait_for_selector("#memory-kv")
    assert status_row(page, "Articles") == "0" and status_row(page, "Last synthesis") == "never"
    assert page.is_disabled("#memory-run")  # a preview comes first

    synthesize(page, dry=True)
    assert "nothing written" in page.inner_text("#memory-synth-note")
    assert page.locator("#memory-stages li[data-state=done]").count() == 9
    assert page.locator("#memory-log li", has_text="would extract").count() == 2
    assert page.is_enabled("#memory-run")

    slow.append(3.0)  # a run that is still extracting when Cancel is pressed
    page.click("#memory-run")
    page.wait_for_selector("#memory-stages li[data-stage=extract][data-state=done]")
    assert page.is_enabled("#memory-cancel")
    page.click("#memory-cancel")
    page.wait_for_selector("#memory-synth-note[data-kind=error]")
    assert "Cancelled" in page.inner_text("#memory-synth-note")
    assert page.locator("#memory-stages li[data-stage=create][data-state=pending]").count() == 1
    assert page.is_disabled("#memory-run")  # preview again before the next run
    slow.clear()
    assert httpx.get(srv.base_url + "/api/memory/list").json()["articles"] == []

    synthesize(page, dry=True)
    synthesize(page, dry=False)
    assert "2 created" in page.inner_text("#memory-synth-note")
    page.wait_for_function("document.querySelector('#memory-kv td')?.textContent === '2'")
    assert status_row(page, "Chats read") == "2"
    assert status_row(page, "Last synthesis") != "never"
    assert status_row(page, "Index size").endswith("KiB")

    page.fill("#memory-q", "vitamin")
    page.keyboard.press("Enter")
    page.wait_for_selector("#memory-hits")
    assert page.locator("#memory-hits > li > a").first.inner_text() == "Kiwi fruit"
    assert "rich in vitamin C" in page.inner_text("#memory-hits")
    assert page.locator("#memory-hits mark", has_text="vitamin").count() >= 1
    page.click("#memory-hits > li > a >> text=Kiwi fruit")
    page.wait_for_selector("#memory-article h1")
    assert page.url.endswith("#memory/Kiwi_fruit")
    assert page.inner_text("#memory-article h1") == "Kiwi fruit"
    assert "Kiwis are rich in vitamin C" in page.inner_text("#memory-article li")
    assert sorted(page.locator("#memory-outbound a").all_inner_texts()) == [
        "Rust language", "Vitamin C"]
    assert page.get_attribute("#memory-outbound a >> text=Vitamin C", "class") == "missing"
    assert page.locator("#memory-inbound a").all_inner_texts() == ["Rust language"]

    subjects = page.locator("#memory-history li").all_inner_texts()
    assert len(subjects) == 2 and "synthesis: see also" in subjects[0]
    page.click("#memory-history li:first-child button")
    page.wait_for_selector("#memory-diff:not([hidden])")
    assert "+## See also" in page.inner_text("#memory-diff")
    assert page.locator("#memory-diff .diff-add", has_text="[[Rust_language]]").count() == 1
    assert page.evaluate("document.activeElement.id") == "memory-diff"

    page.click("#memory-article a >> text=Rust language")  # a wikilink in the article body
    page.wait_for_function(
        "document.getElementById('h-mem-article').textContent === 'Rust language'")
    assert page.locator("#memory-inbound a").all_inner_texts() == ["Kiwi fruit"]
    page.go_back()  # the hash route is history: Back is the article before
    page.wait_for_function("document.getElementById('h-mem-article').textContent === 'Kiwi fruit'")
    assert real_errors(page, missing) == []


def some_articles(srv, store: SessionStore) -> None:
    """A vault with the kiwi article in it, through the HTTP routes (for a test run alone)."""
    httpx.post(srv.base_url + "/api/memory/init", timeout=30)
    saved_chat(store, "What do you know about kiwi and rust?", "Both came up before.")
    with httpx.stream("GET", srv.base_url + "/v1/memory/synthesize", timeout=60) as r:
        assert r.status_code == 200
        r.read()
    assert "Kiwi_fruit" in httpx.get(srv.base_url + "/api/memory/list").json()["articles"]


def test_keyboard_and_phone_width(page, served):
    srv, store, _ = served
    missing: list = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(srv.base_url + "/#memory")
    page.wait_for_selector("#memory-kv, #memory-init")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate(UNNAMED) == []
    if page.locator("#memory-init").count():  # run alone: set the vault up by keyboard
        page.focus("#memory-init")
        page.keyboard.press("Enter")
        page.wait_for_selector("#memory-kv")
    some_articles(srv, store)
    page.focus("#memory-q")
    page.keyboard.type("vitamin")
    page.keyboard.press("Enter")
    page.wait_for_selector("#memory-hits")
    page.keyboard.press("Tab")  # from the box: the scope, the button, then the first hit
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Kiwi fruit"
    page.keyboard.press("Enter")
    page.wait_for_selector("#memory-article h1")
    assert page.evaluate("document.activeElement.id") == "h-mem-article"
    page.focus("#memory-history button")
    page.keyboard.press("Space")
    page.wait_for_selector("#memory-diff:not([hidden])")
    assert page.evaluate("document.activeElement.id") == "memory-diff"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    box = page.locator("#view-memory .card").first.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    assert real_errors(page, missing) == []


def test_memory_screenshots(page, served, tmp_path):
    srv, store, _ = served
    out = Path(os.environ.get("MLXBUN_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    some_articles(srv, store)
    page.set_viewport_size({"width": 1200, "height": 1800})
    page.goto(srv.base_url + "/#memory/Kiwi_fruit")
    page.wait_for_selector("#memory-article h1")
    page.fill("#memory-q", "vitamin")
    page.keyboard.press("Enter")
    page.wait_for_selector("#memory-hits")
    synthesize(page, dry=True)
    page.click("#memory-history li:first-child button")
    page.wait_for_selector("#memory-diff:not([hidden])")
    page.evaluate("document.getElementById('view-memory').scrollTop = 0")
    page.screenshot(path=str(out / "webapp-memory.png"), full_page=True)
