"""The Models page in headless Chromium against a real server and the fake hub: search,
a download with live progress, a cancelled download, serve and delete."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.fake_hub import (
    FakeHub,
    hub_environment,
    padding_safetensors,
    repo_from_dir,
)
from mlxbun_core.testing.server import free_port, start_server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("models-view")
    ckpt = tiny_checkpoint("qwen3", seed=41)
    slow = repo_from_dir(ckpt, downloads=10)
    slow.files["padding.safetensors"] = padding_safetensors(4 << 20)
    repos = {"acme/Tiny-Chat-4bit": repo_from_dir(ckpt, downloads=700),
             "acme/Tiny-Slow-8bit": slow}
    with FakeHub(repos) as hub, hub_environment(root, hub):
        server = start_server(ckpt, max_tokens=4, sessions_dir=root / "sessions")
        yield server, hub
        server.stop()


def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("MLXBUN_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_models_view_search_download_serve_delete(page, served, tmp_path):
    server, hub = served
    page.goto(server.base_url + "/#models")
    page.wait_for_selector("#view-models:not([hidden])")
    page.fill("#hub-search-input", "tiny")
    page.click("#hub-search-form button[type=submit]")
    page.wait_for_selector(".hub-result[data-repo='acme/Tiny-Chat-4bit']")
    assert page.locator(".hub-result").first.get_attribute("data-repo") == "acme/Tiny-Chat-4bit"

    page.click(".hub-result[data-repo='acme/Tiny-Chat-4bit'] button")
    page.wait_for_selector(".download[data-repo='acme/Tiny-Chat-4bit'][data-state=done]",
                           timeout=60_000)
    row = "#hub-local tr[data-repo='acme/Tiny-Chat-4bit']"
    page.wait_for_selector(row)
    page.screenshot(path=str(shots(tmp_path) / "webapp-models.png"))

    page.click(f"{row} >> text=Serve")
    page.wait_for_selector("#models-note:not([hidden])")
    assert "mlxbun serve acme/Tiny-Chat-4bit" in page.inner_text("#models-note")

    page.once("dialog", lambda d: d.accept())
    page.click(f"{row} >> text=Delete")
    page.wait_for_selector(row, state="detached")
    assert "Deleted acme/Tiny-Chat-4bit" in page.inner_text("#models-note")
    assert page.console.errors == []


def test_models_view_shows_progress_and_cancels(page, served):
    server, hub = served
    hub.throttle_s = 0.05
    try:
        page.goto(server.base_url + "/#models")
        page.fill("#hub-search-input", "slow")
        page.click("#hub-search-form button[type=submit]")
        page.click(".hub-result[data-repo='acme/Tiny-Slow-8bit'] button")
        item = ".download[data-repo='acme/Tiny-Slow-8bit'][data-state=active]"
        page.wait_for_selector(item, timeout=30_000)
        page.wait_for_function(
            "s => document.querySelector(s)?.querySelector('progress')?.value > 0.2",
            arg=item, timeout=30_000)
        assert "files" in page.inner_text(f"{item} .download-detail")
        page.click(f"{item} >> text=Cancel")
        done = ".download[data-repo='acme/Tiny-Slow-8bit'][data-state=error]"
        page.wait_for_selector(done, timeout=30_000)
        assert "cancelled" in page.inner_text(f"{done} .download-detail")
        assert page.locator("#hub-local tr[data-repo='acme/Tiny-Slow-8bit']").count() == 0
    finally:
        hub.throttle_s = 0.0
    assert page.console.errors == []


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "unreachable"])
def test_an_offline_search_says_offline_once(page, served, monkeypatch, offline):
    """The server's reason already starts "offline: …" and says cached models still work:
    the page shows it as one sentence, not "Offline: offline: …" with the hint twice."""
    server, _ = served
    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing there
    page.goto(server.base_url + "/#models")
    page.fill("#hub-search-input", "tiny")
    page.click("#hub-search-form button[type=submit]")
    text = page.wait_for_selector("#hub-results .offline").inner_text()
    assert text.startswith("Offline: "), text
    assert text.lower().count("offline:") == 1, text
    assert text.lower().count("still work") == 1, text
    assert ("HF_HUB_OFFLINE is set" if offline == "HF_HUB_OFFLINE"
            else "cannot be reached") in text
    assert page.console.errors == []


def test_a_failed_download_can_be_dismissed_for_good(page, served):
    """A download that failed stays listed with its reason and a Dismiss control; Dismiss
    removes it on the server too, so neither a reload nor GET /downloads brings it back."""
    server, _ = served
    started = httpx.post(server.base_url + "/api/hub/download", json={"repo": "acme/No-Such"})
    job_id = started.json()["job_id"]
    page.goto(server.base_url + "/#models")
    item = f".download[data-job='{job_id}']"
    page.wait_for_selector(f"{item}[data-state=error]", timeout=60_000)
    assert "not found on the hub" in page.inner_text(f"{item} .download-detail")
    dismiss = page.locator(f"{item} button", has_text="Dismiss")
    assert dismiss.get_attribute("aria-label") == "Dismiss the failed download of acme/No-Such"
    dismiss.click()
    page.wait_for_selector(item, state="detached")
    listed = [d["job_id"] for d in httpx.get(server.base_url + "/downloads").json()["downloads"]]
    assert job_id not in listed
    page.reload()
    page.wait_for_selector("#hub-downloads :is(ul, p)")
    assert page.locator(item).count() == 0
    again = httpx.delete(f"{server.base_url}/api/hub/downloads/{job_id}")
    assert again.status_code == 404 and again.json()["ok"] is False
    assert page.console.errors == []


def test_an_active_download_is_not_dismissed(served):
    server, hub = served
    hub.throttle_s = 0.05
    try:
        job_id = httpx.post(server.base_url + "/api/hub/download",
                            json={"repo": "acme/Tiny-Slow-8bit"}).json()["job_id"]
        refused = httpx.delete(f"{server.base_url}/api/hub/downloads/{job_id}")
        assert refused.status_code == 409 and "cancel it first" in refused.json()["error"]
        assert job_id in [d["job_id"] for d in
                          httpx.get(server.base_url + "/downloads").json()["downloads"]]
    finally:
        httpx.post(f"{server.base_url}/api/jobs/{job_id}/cancel")
        hub.throttle_s = 0.0


FITS = """() => { const card = el => el.closest('.card').getBoundingClientRect();
    const lines = el => Math.round(el.getBoundingClientRect().height
                                   / parseFloat(getComputedStyle(el).lineHeight));
    const names = [...document.querySelectorAll(
        '#view-models .hub-id, #hub-local tbody td:first-child')];
    const controls = [...document.querySelectorAll('#view-models .card button')];
    return {page: document.documentElement.scrollWidth <= window.innerWidth,
            names: names.map(el => [el.textContent, lines(el)]),
            outside: controls.filter(b => b.getBoundingClientRect().right > card(b).right
                                          || b.getBoundingClientRect().left < card(b).left)
                             .map(b => b.textContent)}; }"""


def test_the_models_page_fits_a_phone(page, served):
    """At 390 px a search hit, a download and a local model each show their repo id on a
    line or two (not a letter per line) and every button inside its card."""
    server, _ = served
    repo = "acme/Tiny-Chat-4bit"
    httpx.post(server.base_url + "/api/hub/download", json={"repo": repo})
    deadline = time.monotonic() + 60
    while not any(d["repo_id"] == repo and d["state"] == "done" for d in
                  httpx.get(server.base_url + "/downloads").json()["downloads"]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(server.base_url + "/#models")
    page.fill("#hub-search-input", "tiny")
    page.click("#hub-search-form button[type=submit]")
    page.wait_for_selector(f".hub-result[data-repo='{repo}']")
    page.wait_for_selector(f"#hub-local tr[data-repo='{repo}']")
    page.wait_for_selector(f".download[data-repo='{repo}']")
    fits = page.evaluate(FITS)
    assert fits["page"] and fits["outside"] == []
    assert len(fits["names"]) >= 3 and all(n <= 2 for _, n in fits["names"]), fits["names"]
    labels = page.evaluate("""r => [...document.querySelector(`#hub-local tr[data-repo='${r}']`)
        .cells].map(td => getComputedStyle(td, '::before').content)""", repo)
    assert labels[1:4] == ['"size "', '"precision "', '"fits "']  # no header: each says
    assert page.console.errors == []
