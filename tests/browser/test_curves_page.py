"""The curve designer (/curves), the lab paths and the chat's overflow settings in
headless Chromium against a real server: a drawn curve changes what is sampled, a curve
that goes down is refused by the server and the page says why, the keyboard edits points,
and the page fits a phone. Screenshots go where the web app's do."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

pytestmark = pytest.mark.browser

UNNAMED = """() => [...document.querySelectorAll('button, input, textarea, select')]
    .filter(el => !(el.getAttribute('aria-label') || el.labels?.length || el.textContent.trim()))
    .map(el => el.outerHTML.slice(0, 80))"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    s = start_server(tiny_checkpoint("llama", seed=3),
                     sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


def open_designer(page, server, samples: int = 2, max_tokens: int = 8) -> None:
    page.goto(server.base_url + "/curves")
    page.wait_for_selector("#curve-points circle")
    page.fill("#curve-n", str(samples))
    page.fill("#curve-max", str(max_tokens))


def generate(page, timeout: float = 30_000) -> list[str]:
    """Generate both columns; wait for the page to say it is done; the curve's samples."""
    page.evaluate("document.getElementById('curve-note').textContent = ''")
    page.click("#curve-generate")
    page.wait_for_function("document.getElementById('curve-note').textContent.startsWith('Done')",
                           timeout=timeout)
    return page.locator("#samples-curve li").all_inner_texts()


def test_drawing_a_curve_changes_sampling(page, tiny):
    open_designer(page, tiny)
    page.click("#curve-signal")
    page.wait_for_function("document.querySelectorAll('#curve-bins rect').length === 80")
    assert "Signal over 1,024 tokens" in page.inner_text("#curve-note")
    page.click("[data-preset=identity]")
    plain = generate(page)
    assert len(plain) == 2
    # draw: a click under the diagonal near the top adds a point there; the curve is now
    # eight times steeper than the diagonal above it
    box = page.locator("#curve-svg").bounding_box()
    page.mouse.click(box["x"] + box["width"] * (40 + 350 * 18 / 20) / 400,
                     box["y"] + box["height"] * (10 + 260 * 16 / 20) / 300)
    assert page.locator("#curve-points circle").count() == 3
    assert "Monotone" in page.inner_text("#curve-monotone")
    drawn = generate(page)
    assert len(drawn) == 2 and drawn != plain
    assert page.is_hidden("#curve-error")
    assert page.inner_text("#recipe").startswith("temperature")
    assert page.console.errors == []


def test_a_curve_that_goes_down_is_refused(page, tiny):
    open_designer(page, tiny)
    page.click("#curve-add")  # halfway along the last segment: (-10, -10), focused
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Point 2"
    for _ in range(6):  # the keyboard lifts it above the last point (0, 0)
        page.keyboard.press("Shift+ArrowUp")
    assert page.get_attribute("#curve-points circle:nth-child(2)", "aria-valuetext") == "x -10, y 2"
    assert "Not monotone" in page.inner_text("#curve-monotone")
    page.click("#curve-generate")
    page.wait_for_selector("#curve-error:not([hidden])")
    assert "not monotone" in page.inner_text("#curve-error")
    assert page.locator("#samples-curve li").count() == 0
    page.keyboard.press("Tab")  # Delete on a focused point removes it; the curve is fine again
    page.focus("#curve-points circle:nth-child(2)")
    page.keyboard.press("Delete")
    assert page.locator("#curve-points circle").count() == 2
    assert "Monotone" in page.inner_text("#curve-monotone")


def test_phone_width_keyboard_and_labels(page, tiny):
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(tiny.base_url + "/curves")
    page.wait_for_selector("#curve-points circle")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip-link"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "curve-prompt"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate(UNNAMED) == []
    page.focus("#curve-points circle:nth-child(1)")
    page.keyboard.press("ArrowRight")
    assert page.input_value("#curve-rows tr:first-child input") == "-19.5"  # the table follows
    for path in ("/curve-terrain", "/dag"):
        page.goto(tiny.base_url + path)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        assert page.evaluate(UNNAMED) == []
    assert page.console.errors == []


TERRAIN = """() => { const svg = document.getElementById('terrain');
    const view = svg.getBoundingClientRect();
    const inside = [...svg.querySelectorAll('text')].every(t => {
        const b = t.getBoundingClientRect();
        return b.left >= view.left && b.top >= view.top && b.right <= view.right
            && b.bottom <= view.bottom; });
    return {axes: [...svg.querySelectorAll('.axis-title')].map(t => t.textContent),
            x: [...svg.querySelectorAll('.tick-x')].map(t => t.textContent),
            y: [...svg.querySelectorAll('.tick-y')].map(t => t.textContent),
            curves: [...svg.querySelectorAll('polyline.pivot')].map(l => l.getAttribute('stroke')),
            legend: [...document.querySelectorAll('#terrain-legend li')].map(li => [
                li.textContent.trim(), li.querySelector('.swatch')?.dataset.color ?? null]),
            inside}; }"""


@pytest.mark.parametrize("width", [1200, 390])
def test_the_terrain_says_what_its_axes_and_lines_are(page, tiny, width):
    """/curve-terrain: both axes titled and ticked, and a legend that names each line's
    pivot in the line's own colour and says what the dashed diagonal is; all inside the
    picture, on a phone too, and still there after a knob redraws the lines."""
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(tiny.base_url + "/curve-terrain")
    page.wait_for_selector("#terrain polyline")
    for _ in range(2):
        t = page.evaluate(TERRAIN)
        assert t["axes"] == ["token log-prob, relative to the top token (nats)",
                             "logit it is drawn with"]
        assert t["x"] == ["-24", "-20", "-16", "-12", "-8", "-4", "0"]
        assert t["y"] == ["-30", "-20", "-10", "0", "10"]
        assert len(t["curves"]) == 7
        assert t["legend"][:7] == [[f"pivot {p} nats", color]
                                   for p, color in zip(range(0, 13, 2), t["curves"])]
        assert t["legend"][7] == ["no change (y = x)", None]
        assert t["inside"]
        page.fill("#terrain-form [name=temperature]", "0.7")  # a redraw keeps all of it
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.console.errors == []


def test_lab_paths_and_the_overflow_setting(page, tiny):
    page.goto(tiny.base_url + "/quantize")
    page.wait_for_selector("#view-quantize:not([hidden])")
    assert page.url.endswith("/#quantize")
    page.wait_for_selector("#view-quantize .lab-jobs li")
    assert page.is_visible("#q-form button[type=submit]")
    page.goto(tiny.base_url + "/#chat")
    page.wait_for_selector("#conn[data-state=open]")
    page.click("#settings-toggle")
    assert page.input_value("#overflow-policy") == "truncate"
    page.select_option("#overflow-policy", "stop")
    page.wait_for_timeout(300)  # the server echoes the settings; an unknown frame would error
    assert page.input_value("#overflow-policy") == "stop"
    assert page.is_hidden("#error")
    assert page.console.errors == []


def last_answer(page, count: int) -> str:
    page.wait_for_function(
        "n => !document.querySelector('.msg.assistant.streaming')"
        " && document.querySelectorAll('.msg.assistant').length >= n", arg=count, timeout=30_000)
    return page.locator(".msg.assistant .msg-body").last.inner_text()


def answer_again(page, versions: int) -> str:
    """Regenerate the last answer (same prompt, same seed) and read the new one, which is
    version ``versions`` of ``versions`` once the history is drawn again."""
    page.locator(".msg.assistant button", has_text="Regenerate").last.click()
    page.wait_for_function(
        "n => !document.querySelector('.msg.assistant.streaming') && [...document.querySelectorAll("
        "'.msg.assistant .siblings span')].some(s => s.textContent === `${n}/${n}`)",
        arg=versions, timeout=30_000)
    return page.locator(".msg.assistant .msg-body").last.inner_text()


def test_a_chat_samples_with_the_curve_from_the_designer(page, tiny):
    open_designer(page, tiny)
    page.fill("#curve-name", "steep")
    page.click("[data-preset=sharpen]")
    page.click("#curve-use")  # to the chat, which keeps the curve with the session
    page.wait_for_url("**/#chat")
    page.wait_for_selector("#curve-chip:not([hidden])")
    assert page.text_content("#curve-chip") == "Curve: steep✕"
    page.click("#settings-toggle")
    assert page.input_value("#chat-curve") == "steep"
    page.fill("[name=temperature]", "1")
    page.fill("[name=seed]", "5")
    page.fill("[name=max_tokens]", "10")
    page.click("#apply-session")
    page.fill("#composer-input", "Hello there")
    page.keyboard.press("Enter")
    first = last_answer(page, 1)  # read from the cold prompt cache
    curved = answer_again(page, 2)  # the same seed from the warm cache: the same answer
    assert curved == first
    page.click("#curve-chip button")  # removed: the same seed now samples with temperature
    page.wait_for_selector("#curve-chip", state="hidden")
    assert page.input_value("#chat-curve") == ""
    plain = answer_again(page, 3)
    assert plain != curved
    assert answer_again(page, 4) == plain  # the seed decides, so the curve made the difference
    page.select_option("#chat-curve", "steep")  # back on from the settings
    page.wait_for_selector("#curve-chip:not([hidden])")
    assert answer_again(page, 5) == curved
    page.reload()  # the chat reopens with its curve
    page.wait_for_selector("#curve-chip:not([hidden])")
    assert page.is_hidden("#error")
    assert page.console.errors == []


def test_the_chat_refuses_a_curve_that_goes_down(page, tiny):
    open_designer(page, tiny)
    page.click("#curve-add")
    for _ in range(6):
        page.keyboard.press("Shift+ArrowUp")
    assert "Not monotone" in page.inner_text("#curve-monotone")
    page.click("#curve-use")
    page.wait_for_url("**/#chat")
    page.wait_for_selector("#error:not([hidden])")
    assert "curve.points is not monotone at point 2" in page.inner_text("#error")
    page.click("#settings-toggle")
    assert page.inner_text("#chat-curve-note").startswith("Refused: curve.points is not monotone")
    assert page.is_hidden("#curve-chip") and page.input_value("#chat-curve") == ""
    page.set_viewport_size({"width": 390, "height": 844})  # the picker and chip on a phone
    page.select_option("#chat-curve", "plateau")
    page.wait_for_selector("#curve-chip:not([hidden])")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate("document.getElementById('chat-curve').labels.length") == 1
    page.focus("#curve-chip button")  # the chip's ✕ by keyboard
    page.keyboard.press("Enter")
    page.wait_for_selector("#curve-chip", state="hidden")


@pytest.fixture(scope="module")
def smol(smollm2_path, tmp_path_factory):
    s = start_server(smollm2_path, sessions_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    s.stop()


# each change of a column: [the column, its samples, what the default column's status says]
ARRIVALS = """() => { window.arrivals = [];
    const said = document.getElementById('status-default');
    for (const id of ['samples-curve', 'samples-default']) {
        const list = document.getElementById(id);
        new MutationObserver(() => window.arrivals.push([id, list.children.length,
                                                         said?.textContent]))
            .observe(list, {childList: true}); } }"""


def test_the_default_column_fills_while_the_curve_samples(page, smol):
    """3 samples on SmolLM2 (the page's default count; 12 tokens, not its 40, to keep CI
    short): seeded samples run one at a time, so a column asked for after all of the
    other's waited for all of them (on a busy CPU "Sampling…" with an empty default column
    for over 25 s). The columns take turns, each shows its progress, and the samples are
    those the server's own ``n`` gives (choice i with seed + i)."""
    open_designer(page, smol, samples=3, max_tokens=12)
    page.evaluate(ARRIVALS)
    page.click("#curve-generate")
    page.wait_for_function("document.getElementById('curve-note').textContent.startsWith('Done')",
                           timeout=240_000)
    arrivals = [a[:2] for a in page.evaluate("window.arrivals") if a[1]]
    assert arrivals == [["samples-curve", 1], ["samples-default", 1], ["samples-curve", 2],
                        ["samples-default", 2], ["samples-curve", 3], ["samples-default", 3]]
    said = [a[2] for a in page.evaluate("window.arrivals") if a[1]]
    assert said[:2] == ["Sampling 1 of 3…", "Next: 2 of 3"]  # it said what it was doing
    curve = page.locator("#samples-curve li").all_inner_texts()
    default = page.locator("#samples-default li").all_inner_texts()
    assert len(curve) == len(default) == 3 and all(t.strip() for t in curve + default)
    assert page.inner_text("#status-curve") == page.inner_text("#status-default") == ""
    assert page.is_enabled("#curve-generate") and page.is_hidden("#curve-error")
    prompt = page.input_value("#curve-prompt")
    whole = httpx.post(smol.base_url + "/generate", timeout=240, json={
        "prompt": prompt, "n": 3, "max_tokens": 12, "seed": 0, "default": True}).json()
    assert [s["text"] for s in whole["samples"]] == default
    assert page.console.errors == []


def test_curves_screenshots(page, smol, tmp_path):
    out = Path(os.environ.get("MLXBUN_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    for_docs = bool(os.environ.get("MLXBUN_SCREENSHOT_DIR"))  # long samples to show
    open_designer(page, smol, samples=2, max_tokens=20 if for_docs else 8)
    page.click("#curve-signal")
    page.wait_for_function("document.querySelectorAll('#curve-bins rect').length === 80")
    page.click("[data-preset=sharpen]")
    assert len(generate(page, timeout=240_000)) == 2
    page.screenshot(path=str(out / "webapp-curves.png"), full_page=True)
    page.fill("#curve-name", "sharpen")
    page.click("#curve-use")  # and the chat that samples with it
    page.wait_for_selector("#curve-chip:not([hidden])")
    page.click("#settings-toggle")
    page.fill("[name=max_tokens]", "40" if for_docs else "12")
    page.click("#apply-session")
    page.fill("#composer-input", "Write one sentence about the sea.")
    page.keyboard.press("Enter")
    assert last_answer(page, 1)
    page.screenshot(path=str(out / "webapp-chat-curve.png"))


@pytest.fixture(scope="module")
def small_window(tmp_path_factory):
    ckpt = tiny_checkpoint("qwen3", config_overrides={"max_position_embeddings": 1024})
    s = start_server(ckpt, max_tokens=12, sessions_dir=tmp_path_factory.mktemp("sessions"))
    s.engine.defaults["logit_bias"] = {str(i): -100 for i in s.engine.model.tokenizer.eos_token_ids}
    yield s
    s.stop()


def test_a_long_chat_warns_then_leaves_out_old_turns_with_a_note(page, small_window):
    page.goto(small_window.base_url + "/#chat")
    page.wait_for_selector("#conn[data-state=open]")
    warned = False
    for i in range(8):
        page.fill("#composer-input", f"Message {i}: " + " ".join(f"w{i}x{j}" for j in range(12)))
        page.keyboard.press("Enter")
        page.wait_for_function(
            "n => !document.querySelector('.msg.assistant.streaming')"
            " && document.querySelectorAll('.msg.assistant').length >= n", arg=i + 1)
        page.wait_for_timeout(100)
        if page.locator(".trim-note").count():
            break
        warned = warned or page.is_visible("#context-warning")
    else:
        pytest.fail("the chat never outgrew the window")
    assert warned, "no warning before the first turn was left out"
    assert "oldest turns" in page.inner_text("#context-warning")
    assert "earlier messages were left out" in page.inner_text(".trim-note")
    assert page.is_hidden("#error")
    page.reload()  # the note is kept with the answer
    page.wait_for_selector(".trim-note")
    assert page.locator(".msg.user").count() == i + 1  # the chat still shows every message
    assert page.console.errors == []
