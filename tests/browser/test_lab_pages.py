"""The lab pages (#quantize, #finetune, #dataset) in headless Chromium against one real
server on a tiny checkpoint: each wizard end to end (a quantize job whose result is in
the library and offered to serve; a fine-tune whose loss chart fills from the job
stream, whose adapter mounts and answers; a dataset inspection that counts rows and
flags the broken ones, an upload handed to the fine-tune page), Cancel on a running
job, and the keyboard and a phone's width on every page. Screenshots go where the web
app's do (``make screenshots``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import environ
from mlxbun_core.testing.server import start_server

pytestmark = pytest.mark.browser

MODEL = "Tiny-Llama"
UNNAMED = """() => [...document.querySelectorAll(
        '.lab-view:not([hidden]) button, .lab-view:not([hidden]) input, '
        + '.lab-view:not([hidden]) select')]
    .filter(el => !(el.getAttribute('aria-label') || el.labels?.length || el.textContent.trim()))
    .map(el => el.outerHTML.slice(0, 80))"""


def rows(n: int, word: str = "banana") -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Say the word {i}"},
                          {"role": "assistant", "content": f"{word} {word} {word}"}]}
            for i in range(n)]


def jsonl(items) -> str:
    return "".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A server whose home holds the tiny model in its library and one dataset."""
    home = tmp_path_factory.mktemp("lab-home")
    shutil.copytree(tiny_checkpoint("llama"), home / "models" / MODEL)
    data = home / "datasets" / "greetings"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text(jsonl(rows(8)))
    (data / "valid.jsonl").write_text(jsonl(rows(2)))
    sessions = tmp_path_factory.mktemp("lab-sessions")
    # MLX_DISABLE_COMPILE: on the CPU, skip the one-time JIT of the train step
    with environ(MLXBUN_HOME=str(home), MLX_DISABLE_COMPILE="1"):
        server = start_server(home / "models" / MODEL, max_tokens=8, sessions_dir=sessions)
        server.home, server.sessions = home, sessions
        yield server
        server.stop()


def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("MLXBUN_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def snap(page, tmp_path: Path, name: str, target: str) -> None:
    """A screenshot for the docs: a tall window, ``target`` in the middle of it."""
    page.set_viewport_size({"width": 1200, "height": 1300})
    page.locator(target).evaluate("el => el.scrollIntoView({block: 'center'})")
    page.screenshot(path=str(shots(tmp_path) / name))
    page.set_viewport_size({"width": 1200, "height": 820})


def open_page(page, server, route: str) -> None:
    page.goto(f"{server.base_url}/#{route}")
    page.wait_for_selector(f"#view-{route}:not([hidden])")


def test_quantize_wizard_serves_its_result_screenshots(page, lab, tmp_path):
    page.goto(lab.base_url + "/quantize")  # the legacy path lands on the wizard
    page.wait_for_selector("#view-quantize:not([hidden])")
    assert page.url.endswith("/#quantize")
    page.wait_for_selector(f"#q-model option[value='{MODEL}']", state="attached")
    page.wait_for_selector("#q-check[data-ok='1']")
    assert "can be quantized" in page.inner_text("#q-check")
    page.select_option("#q-group", "32")
    assert "About" in page.inner_text("#q-estimate")
    page.click("#q-form button[type=submit]")
    page.wait_for_selector("#view-quantize .job-panel[data-state=done]", timeout=120_000)
    assert page.evaluate("document.querySelector('#view-quantize .job-panel progress').value") == 1
    name = f"{MODEL}-4bit-g32"
    page.wait_for_selector("#view-quantize .lab-listed")
    assert page.inner_text("#view-quantize .lab-listed") == f"{name} is in your library."
    listed = httpx.get(lab.base_url + "/api/hub/local?refresh=1").json()["models"]
    assert [m["quant_bits"] for m in listed if m["repo_id"] == name] == [4]
    snap(page, tmp_path, "webapp-quantize.png", "#view-quantize .job-panel")
    page.click(f"#view-quantize .job-result button >> text=Serve {name}")
    page.wait_for_selector("#view-quantize .serve-note code")
    assert page.inner_text("#view-quantize .serve-note code") == f"mlxbun serve {name}"
    assert page.locator("#view-quantize .lab-jobs li[data-status=done]").count() >= 1
    assert page.console.errors == []


def test_finetune_wizard_charts_mounts_chats_screenshots(page, lab, tmp_path):
    open_page(page, lab, "finetune")
    page.wait_for_selector(f"#ft-model option[value='{MODEL}']", state="attached")
    page.wait_for_selector("#ft-data option", state="attached")
    page.select_option("#ft-data", str(lab.home / "datasets" / "greetings"))
    assert page.is_disabled("#ft-form button[type=submit]")  # inspect before submit
    page.click("#ft-inspect")
    page.wait_for_selector("#ft-form .inspect-verdict.ok")
    assert "8 training rows, 2 validation rows" in page.inner_text("#ft-form .inspect-verdict")
    assert "tokens per row" in page.inner_text("#ft-form .inspect-summary")
    for name, value in (("rank", "4"), ("steps_per_eval", "3"), ("learning_rate", "0.05")):
        page.fill(f"#ft-{name}", value)
    page.fill("#ft-iters", "6")
    page.press("#ft-iters", "Enter")  # Enter submits the form
    panel = "#view-finetune .job-panel"
    page.wait_for_selector(f"{panel}[data-state=done]", timeout=180_000)
    figure = page.locator("#view-finetune .loss-figure")
    assert figure.get_attribute("data-train-points") == "6"
    assert int(figure.get_attribute("data-val-points")) >= 2
    assert page.locator("#view-finetune .series.train circle").count() == 6
    assert "train loss" in page.inner_text("#loss-caption")
    snap(page, tmp_path, "webapp-finetune.png", "#view-finetune .loss-figure")

    page.fill("#ft-adapter-id", "greeter")
    page.click("#ft-mount")
    page.wait_for_selector("#view-finetune .mount-note:has-text('Mounted as greeter')")
    mounted = httpx.get(lab.v1 + "/adapters").json()["adapters"]
    assert [a["id"] for a in mounted] == ["greeter"]
    page.fill("#ft-try-prompt", "Say the word 3")
    page.press("#ft-try-prompt", "Enter")
    page.wait_for_selector("#view-finetune .try-reply[data-ok='1']")
    assert page.inner_text("#view-finetune .try-reply").strip()

    page.click("#view-finetune .try-adapter button >> text=Chat with it")
    page.wait_for_selector("#view-chat:not([hidden])")
    page.wait_for_function("document.getElementById('conn').dataset.state === 'open'")
    page.fill("#composer-input", "Hello there")
    page.press("#composer-input", "Enter")
    page.wait_for_function("!document.querySelector('.msg.assistant.streaming')"
                           " && document.querySelectorAll('.msg.assistant').length === 1",
                           timeout=60_000)
    chats = [p.read_text() for p in lab.sessions.glob("*.jsonl")]
    assert any(re.search(r'"adapter":\s*"greeter"', c) and "Hello there" in c for c in chats)
    assert page.console.errors == []


def test_cancel_stops_a_running_job(page, lab):
    open_page(page, lab, "finetune")
    page.wait_for_selector("#ft-data option", state="attached")
    page.select_option("#ft-data", str(lab.home / "datasets" / "greetings"))
    page.click("#ft-inspect")
    page.wait_for_selector("#ft-form .inspect-verdict.ok")
    page.fill("#ft-iters", "100000")
    page.click("#ft-form button[type=submit]")
    panel = "#view-finetune .job-panel"
    page.wait_for_selector(f"{panel}[data-state=running]", timeout=60_000)
    page.click(f"{panel} button >> text=Cancel")
    page.wait_for_selector(f"{panel}[data-state=failed]", timeout=30_000)
    assert "killed (SIGTERM)" in page.inner_text(f"{panel} .job-status")
    job = page.get_attribute(panel, "data-job")
    assert httpx.get(f"{lab.base_url}/api/jobs/{job}").json()["job"]["status"] == "failed"
    assert page.console.errors == []


def test_dataset_page_flags_broken_rows_hands_off_screenshots(page, lab, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(jsonl([*rows(3), "{not json", {"question": "no format"}, *rows(2)]))
    open_page(page, lab, "dataset")
    page.fill("#ds-data-path", str(broken))
    page.press("#ds-data-path", "Enter")  # Enter inspects
    page.wait_for_selector("#view-dataset .inspect-verdict")
    summary = page.inner_text("#view-dataset .inspect-summary")
    assert "train rows\t5 (2 unusable)" in summary, summary
    flagged = page.locator("#view-dataset .inspect-problems li[data-line='4']")
    assert "not valid JSON" in flagged.inner_text()
    assert "no known format" in page.inner_text(
        "#view-dataset .inspect-problems li[data-line='5']")
    assert page.locator("#view-dataset .inspect-samples details").count() == 3
    snap(page, tmp_path, "webapp-dataset.png", "#view-dataset .inspect-problems")

    upload = tmp_path / "my greetings.jsonl"
    upload.write_text(jsonl(rows(10, "hello")))
    page.fill("#ds-data-path", "")
    page.set_input_files("#ds-data-file", str(upload))
    page.wait_for_selector(
        "#view-dataset .dataset-picker p:has-text('Saved as upload-my-greetings')")
    page.click("#ds-form button[type=submit]")
    page.wait_for_selector("#view-dataset .inspect-verdict.ok")
    assert "9 training rows, 1 validation rows" in page.inner_text("#view-dataset .inspect-verdict")
    page.click("#view-dataset button >> text=Fine-tune on this")
    page.wait_for_selector("#view-finetune:not([hidden])")
    page.wait_for_selector("#ft-form .inspect-verdict.ok")
    assert page.is_enabled("#ft-form button[type=submit]")
    assert page.input_value("#ft-data").split("/")[-1].startswith("upload-my-greetings-")
    assert page.console.errors == []


@pytest.mark.parametrize("route", ["quantize", "finetune", "dataset"])
def test_lab_page_at_phone_width_with_the_keyboard(page, lab, route):
    sent: list = []  # the chat socket's frames: the context follows the form's steps
    page.on("websocket", lambda ws: ws.on("framesent", lambda f: sent.append(f)))
    page.set_viewport_size({"width": 390, "height": 844})
    open_page(page, lab, route)
    page.wait_for_selector("#conn[data-state=open]")
    page.wait_for_timeout(300)  # the lists load
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    section = page.locator(f"#view-{route}")
    assert page.evaluate(f"document.getElementById('view-{route}').scrollWidth"
                         f" <= document.getElementById('view-{route}').clientWidth")
    assert page.evaluate(UNNAMED) == []
    assert page.get_attribute(".views a[data-lab]", "aria-current") == "page"
    assert section.locator(f".lab-nav a[href='#{route}']").get_attribute("aria-current") == "page"
    # Tab walks from the page's first link through its controls to the form's submit button
    section.locator(".lab-nav a").first.focus()
    submit = section.locator("form button[type=submit]").first
    for _ in range(40):
        page.keyboard.press("Tab")
        if submit.evaluate("b => b === document.activeElement || b.disabled"):
            break
    assert submit.evaluate("b => b === document.activeElement || b.disabled")
    # each step of the form that takes the focus goes to the chat as the context's step
    legends = section.locator("form.lab-form > fieldset > legend").all_inner_texts()
    assert len(legends) >= 2
    sent.clear()
    for i in range(len(legends)):
        section.locator("form.lab-form > fieldset").nth(i).locator(
            "input:not([type=file]), select").first.focus()
    page.wait_for_timeout(200)  # the frames go out
    steps = [c["context"].get("step") for c in map(json.loads, sent)
             if c.get("type") == "context" and c["context"]["route"] == route]
    assert steps == [{"index": i, "count": len(legends), "label": text}
                     for i, text in enumerate(legends)]
    assert page.console.errors == []
