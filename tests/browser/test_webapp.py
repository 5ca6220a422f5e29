"""The web app in a real browser (headless Chromium) against a real server.

One server runs SmolLM2-135M-Instruct, so replies are real text; tiny random models
(one that never says EOS, for a reply long enough to stop) keep the other tests quick.
Screenshots go to ``$MLXBUN_SCREENSHOT_DIR`` (``make screenshots`` points it at docs/),
else a temp dir.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

pytestmark = pytest.mark.browser

# a 1x1 PNG
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
                       "hKmMIQAAAABJRU5ErkJggg==")


@pytest.fixture(scope="module")
def smol(smollm2_path, tmp_path_factory):
    s = start_server(smollm2_path, max_tokens=24, sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    s = start_server(tiny_checkpoint("qwen3"), max_tokens=8,
                     sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    s = start_server(tiny_checkpoint("qwen3"), max_tokens=4000,
                     sessions_dir=tmp_path_factory.mktemp("sessions"))
    s.engine.defaults["logit_bias"] = {str(i): -100 for i in s.engine.model.tokenizer.eos_token_ids}
    yield s
    s.stop()


def open_app(page, server, route: str = ""):
    page.goto(server.base_url + "/" + route)
    page.wait_for_selector("#conn[data-state=open]")


def send(page, text: str) -> None:
    page.fill("#composer-input", text)
    page.keyboard.press("Enter")


def answers(page) -> int:
    return page.locator(".msg.assistant").count()


def wait_for_answer(page, count: int, timeout: float = 60_000) -> None:
    page.wait_for_function(
        "n => !document.querySelector('.msg.assistant.streaming')"
        " && document.querySelectorAll('.msg.assistant').length >= n", arg=count, timeout=timeout)


def record_stream(page) -> None:
    """Note the streaming answer's length at every DOM change, in window.lengths."""
    page.evaluate("""() => {
        window.lengths = [];
        new MutationObserver(() => {
            const live = document.querySelector('.msg.assistant.streaming .msg-body');
            if (live) window.lengths.push(live.textContent.length);
        }).observe(document.getElementById('messages'),
                   {subtree: true, childList: true, characterData: true});
    }""")


def for_docs() -> bool:
    """Screenshots for the docs (``make screenshots``): answers long enough to show; a plain
    run asks for short ones (on the CPU, SmolLM2 takes ~0.15 s a token)."""
    return bool(os.environ.get("MLXBUN_SCREENSHOT_DIR"))


def shots(tmp_path) -> Path:
    out = Path(os.environ.get("MLXBUN_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_the_page_loads_clean_and_a_reply_streams_in(page, smol):
    open_app(page, smol)
    assert page.title() == "mlxbun"
    assert page.inner_text("#model-name") == smol.engine.model.id
    record_stream(page)
    send(page, "Tell me three facts about Paris.")
    page.wait_for_selector(".msg.user >> text=Tell me three facts about Paris.")
    wait_for_answer(page, 1)
    grew = page.evaluate("window.lengths.filter((n, i, a) => i === 0 || n > a[i - 1]).length")
    assert grew >= 3, "the answer should appear piece by piece, not at once"
    answer = page.inner_text(".msg.assistant .msg-body")
    assert len(answer.strip()) > 10
    assert page.locator(".msg.assistant .meta").first.inner_text().endswith("lane")
    assert page.inner_text(".session.active .session-title") == "Tell me three facts about Paris."
    assert page.console.errors == []


def test_switching_sessions_and_searching_them(page, quick):
    open_app(page, quick)
    send(page, "Name a fruit that is yellow.")
    wait_for_answer(page, 1)
    page.click("#new-session")
    page.wait_for_selector(".empty-hint")
    send(page, "Name a planet with rings.")
    wait_for_answer(page, 1)
    page.click(".session-open:has-text('Name a fruit')")
    page.wait_for_selector(".msg.user >> text=Name a fruit that is yellow.")
    assert page.locator(".msg.user").count() == 1
    assert "Name a fruit" in page.inner_text(".session.active")
    page.fill("#session-search", "RINGS")
    hit = page.wait_for_selector(".search-hit")
    assert hit.inner_text().startswith("Name a planet with rings.")
    assert page.inner_text(".search-hit mark") == "rings"
    hit.click()
    page.wait_for_selector(".msg.user >> text=Name a planet with rings.")
    assert page.console.errors == []


def test_install_criteria_are_met(profile_page, quick):
    page = profile_page
    open_app(page, quick)
    scope = page.evaluate("navigator.serviceWorker.ready.then(r => r.scope)")
    assert scope == quick.base_url + "/"
    script = page.evaluate("navigator.serviceWorker.ready.then(r => r.active.scriptURL)")
    assert script == quick.base_url + "/sw.js"
    cdp = page.context.new_cdp_session(page)
    manifest = cdp.send("Page.getAppManifest")
    assert manifest["url"] == quick.base_url + "/manifest.webmanifest" and not manifest["errors"]
    assert cdp.send("Page.getInstallabilityErrors")["installabilityErrors"] == []
    cached = page.evaluate("""async () => {
        const keys = await caches.keys();
        const cache = await caches.open(keys[0]);
        return (await cache.keys()).map(r => new URL(r.url).pathname);
    }""")
    assert {"/", "/assets/app.js", "/assets/app.css",
            "/assets/vendor/highlight.min.js"} <= set(cached)
    assert not [p for p in cached if not (p == "/" or p.startswith("/assets/"))]
    assert page.console.errors == []


def test_stop_regenerate_and_edit(page, endless):
    open_app(page, endless)
    send(page, "Go on forever")
    page.wait_for_selector(".msg.assistant.streaming .msg-body:not(:empty)")
    page.click("#stop")
    wait_for_answer(page, 1)
    assert page.is_visible(".msg.assistant >> text=(stopped)")
    assert page.is_visible("#send") and not page.is_visible("#stop")
    page.click("#settings-toggle")
    page.fill("[name=max_tokens]", "4")
    page.click("#apply-session")
    page.click("text=Regenerate")
    page.wait_for_selector(".msg.assistant .siblings >> text=2/2")
    assert not page.is_visible(".msg.assistant >> text=(stopped)")
    page.click(".msg.assistant .siblings >> [aria-label='Previous version']")
    page.wait_for_selector(".msg.assistant .siblings >> text=1/2")
    assert page.is_visible(".msg.assistant >> text=(stopped)")
    page.click(".msg.user >> text=Edit")
    page.fill(".edit-box textarea", "Stop soon")
    page.click(".edit-box >> text=Send")
    page.wait_for_selector(".msg.user .siblings >> text=2/2")
    wait_for_answer(page, 1)
    assert page.inner_text(".msg.user .msg-body") == "Stop soon"
    assert page.console.errors == []


def test_images_attach_and_a_model_without_vision_says_so(page, quick, tmp_path):
    png = tmp_path / "dot.png"
    png.write_bytes(PNG)
    open_app(page, quick)
    page.wait_for_selector("#session-list[data-rendered]", state="attached")  # then count
    sessions = page.locator(".session").count()
    page.set_input_files("#attach-input", str(png))
    page.wait_for_selector(".attachments .chip img")
    send(page, "What is in this picture?")
    banner = page.wait_for_selector("#error:not([hidden])")
    assert "does not accept images" in banner.inner_text()
    assert page.input_value("#composer-input") == "What is in this picture?"  # given back
    assert page.locator(".attachments .chip").count() == 1
    assert page.locator(".msg.user").count() == 0
    assert page.locator(".session").count() == sessions  # nothing was saved
    assert page.console.errors == []


def test_phone_width_keyboard_and_labels(page, quick):
    page.set_viewport_size({"width": 390, "height": 844})
    open_app(page, quick)
    page.keyboard.press("Tab")  # the first stop is the skip link, which lands in the message box
    assert page.evaluate("document.activeElement.className") == "skip-link"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "composer-input"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    sidebar = page.locator("#sidebar")
    assert sidebar.bounding_box()["x"] + sidebar.bounding_box()["width"] <= 0  # off screen
    page.click("#sidebar-toggle")
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    assert page.get_attribute("#sidebar-toggle", "aria-expanded") == "true"
    page.keyboard.press("Escape")
    assert page.get_attribute("#sidebar-toggle", "aria-expanded") == "false"
    unnamed = page.evaluate("""() => [
            ...document.querySelectorAll('button, input, textarea, select')]
        .filter(el => el.type !== 'file')
        .filter(el => !(el.getAttribute('aria-label') || el.labels?.length
                        || el.textContent.trim()))
        .map(el => el.outerHTML.slice(0, 80))""")
    assert unnamed == []


SYSTEM_BOX = """() => { const box = document.getElementById('system-prompt');
    return {height: box.getBoundingClientRect().height, client: box.clientHeight,
            content: box.scrollHeight, line: parseFloat(getComputedStyle(box).lineHeight),
            placeholder: box.placeholder, value: box.value}; }"""


@pytest.mark.parametrize("width,height", [(1440, 900), (1280, 800), (390, 844)])
def test_the_system_prompt_box_shows_its_placeholder_whole(page, quick, width, height):
    """Settings' system-prompt box keeps its three rows at desktop, laptop and phone sizes
    (the panel scrolls instead of squeezing it), and its placeholder fits inside it."""
    page.set_viewport_size({"width": width, "height": height})
    open_app(page, quick)
    page.click("#settings-toggle")
    page.wait_for_selector("#settings:not([hidden])")
    box = page.evaluate(SYSTEM_BOX)
    assert box["value"] == "" and box["placeholder"] == "You are a helpful assistant."
    assert box["height"] >= 3 * box["line"], box  # rows="3", not a sliver
    assert box["content"] <= box["client"], box  # the placeholder is not cut
    page.fill("#system-prompt", "Answer in French.\nKeep it short.")  # two lines fit too
    assert page.evaluate(SYSTEM_BOX)["content"] <= page.evaluate(SYSTEM_BOX)["client"]
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.console.errors == []


def test_the_status_models_table_fits_a_phone(page, quick):
    """At 390 px each /v1/models row is a block: its id on a line of its own, each value
    labelled on one line ("generic" was broken as "generi / c", "serving" as "servi / ng")."""
    page.set_viewport_size({"width": 390, "height": 844})
    open_app(page, quick, "#status")
    page.wait_for_selector("#status-models tbody td")
    cells = page.evaluate("""() => [...document.querySelectorAll('#status-models tbody td')]
        .map(td => [td.textContent, getComputedStyle(td, '::before').content,
                    Math.round(td.getBoundingClientRect().height
                               / parseFloat(getComputedStyle(td).lineHeight))])""")
    assert [c[0] for c in cells[:5]] == [quick.engine.model.id, "generic", "generic",
                                         str(quick.engine.model.context_window), "serving"]
    assert [c[1] for c in cells[1:5]] == ['"family "', '"plugin "', '"context "', '"state "']
    assert all(lines == 1 for _, _, lines in cells), cells
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.console.errors == []


PAGES = ["Chat", "Status", "Models", "Lab", "Memory", "Curves"]
TOP_BAR = """() => { const nav = document.querySelector('.views').getBoundingClientRect();
    return {fits: document.documentElement.scrollWidth <= window.innerWidth,
            links: [...document.querySelectorAll('.views a')].map(a => {
                const r = a.getBoundingClientRect();
                return [a.textContent, r.left >= nav.left && r.right <= nav.right + 0.5,
                        a.getAttribute('aria-current')]; })}; }"""


@pytest.mark.parametrize("width", [390, 320])
def test_the_top_bar_fits_a_phone_and_marks_the_page(page, quick, width):
    """Six page links on a phone: all on screen, in Tab order, the current one marked
    (Lab on each lab page, Memory on an article); narrower still, the current one is
    scrolled into view."""
    page.set_viewport_size({"width": width, "height": 700})
    for route, current in (("chat", "Chat"), ("quantize", "Lab"), ("dataset", "Lab"),
                           ("memory/Kiwi%20fruit", "Memory"), ("status", "Status")):
        page.goto(f"{quick.base_url}/#{route}")
        page.wait_for_selector(f"#view-{route.split('/')[0]}:not([hidden])")
        bar = page.evaluate(TOP_BAR)
        assert bar["fits"], route
        assert [(name, shown) for name, shown, _ in bar["links"]] == [(p, True) for p in PAGES]
        assert [name for name, _, mark in bar["links"] if mark == "page"] == [current], route
    page.focus("#sidebar-toggle")  # Tab walks the links in order, Enter follows one
    for name in PAGES:
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == name
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    page.wait_for_selector("#view-memory:not([hidden])")
    page.goto(quick.base_url + "/curves")  # the designer's bar has the same six
    bar = page.evaluate(TOP_BAR)
    assert bar["fits"] and [(n, s, m) for n, s, m in bar["links"]] == [
        (p, True, "page" if p == "Curves" else None) for p in PAGES]
    page.set_viewport_size({"width": 260, "height": 700})  # too narrow: the links scroll
    page.goto(quick.base_url + "/#memory")
    page.wait_for_selector("#view-memory:not([hidden])")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert dict((n, s) for n, s, _ in page.evaluate(TOP_BAR)["links"])["Memory"] is True
    assert page.console.errors == [] or all("404" in e for e in page.console.errors)


def test_status_view_and_screenshots(page, smol, tmp_path):
    out = shots(tmp_path)
    open_app(page, smol)
    page.click("#settings-toggle")
    page.fill("[name=max_tokens]", "96" if for_docs() else "24")  # the docs show a whole answer
    page.click("#apply-session")
    page.click("#settings-toggle")
    send(page, "Write a short Python function that reverses a string.")
    wait_for_answer(page, 1)
    page.wait_for_timeout(300)
    page.screenshot(path=str(out / "webapp-chat.png"))
    page.click("nav >> text=Status")
    page.wait_for_selector("#status-model table")
    assert smol.engine.model.id in page.inner_text("#status-model")
    page.wait_for_selector("#status-stats table")
    assert "done" in page.inner_text("#status-stats")
    assert page.evaluate("location.hash") == "#status"
    page.screenshot(path=str(out / "webapp-status.png"))
    page.goto(smol.base_url + "/status")  # the legacy path lands on the hash route
    page.wait_for_selector("#view-status:not([hidden])")
    assert page.url.endswith("/#status")
    assert page.console.errors == []


def test_a_reload_mid_answer_keeps_the_partial_answer(page, endless):
    """The answer so far is saved as it streams: after a reload the same chat is open again
    and shows it, marked, with Regenerate."""
    open_app(page, endless)
    send(page, "Keep talking")
    page.wait_for_selector(".msg.assistant.streaming .msg-body:not(:empty)")
    page.wait_for_timeout(800)  # past a save interval
    page.reload()
    page.wait_for_selector("#conn[data-state=open]")
    page.wait_for_selector(".msg.user >> text=Keep talking")  # the chat is open again
    note = page.wait_for_selector(".msg.assistant .finish-note").inner_text()
    assert note in ("(stopped)", "(interrupted)")
    body = page.inner_text(".msg.assistant .msg-body")
    assert len(body.replace(note, "").strip()) > 0  # the partial answer itself
    assert page.is_visible(".msg.assistant >> text=Regenerate")
    assert page.inner_text(".session.active .session-title") == "Keep talking"
    page.click("#settings-toggle")
    page.fill("[name=max_tokens]", "4")
    page.click("#apply-session")
    page.click("text=Regenerate")
    page.wait_for_selector(".msg.assistant .siblings >> text=2/2")
    wait_for_answer(page, 1)
    assert page.console.errors == []


def test_the_phone_drawer_has_its_own_close_control(page, quick):
    page.set_viewport_size({"width": 390, "height": 844})
    open_app(page, quick)
    assert not page.is_visible("#sidebar-close")  # inside the closed drawer, off screen
    page.click("#sidebar-toggle")
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    close = page.locator("#sidebar-close")
    assert close.is_visible() and close.get_attribute("aria-label") == "Close chats"
    box, drawer = close.bounding_box(), page.locator("#sidebar").bounding_box()
    assert box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= drawer["width"]
    assert page.evaluate("document.activeElement.id") == "sidebar-close"
    close.click()
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().right <= 0")
    assert page.get_attribute("#sidebar-toggle", "aria-expanded") == "false"
    assert page.evaluate("document.activeElement.id") == "sidebar-toggle"
    page.click("#sidebar-toggle")  # a tap on the dimmed page beside the drawer closes it too
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    page.mouse.click(380, 600)
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().right <= 0")
    assert page.get_attribute("#sidebar-toggle", "aria-expanded") == "false"
    page.set_viewport_size({"width": 1200, "height": 820})
    assert not page.is_visible("#sidebar-close")  # a wide screen has no drawer
    assert page.console.errors == []
