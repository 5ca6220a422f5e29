"""The web page under ``serve --isolate --model-pool 2``: a real parent process with a real
engine child, and headless Chromium. Chat needs an in-process engine, so the page must say
so once, disable what needs the chat, and never open (or retry) a socket bound to be
refused. The Quantize page's Serve puts its result in the pool (the parent never scanned
it before), says when it is loaded, and a chat that names it is answered by it."""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import serve

pytestmark = pytest.mark.browser

MODEL = "Tiny-Llama"


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolated")
    model = root / "home" / "models" / MODEL  # in the library: the Quantize page lists it
    shutil.copytree(tiny_checkpoint("llama"), model)
    env = {"MLXBUN_HOME": str(root / "home"), "HF_HOME": str(root / "hf"),
           "HF_HUB_OFFLINE": "1", "MLX_DISABLE_COMPILE": "1"}
    with serve("--isolate", "--model-pool", "2", "--model", model, env=env, ready="/engine",
               timeout=180) as proc:
        yield proc, proc.base


# how many times the page tells the reason (the flag it names): in its visible text and in
# the placeholders and titles of its controls
SAID = """() => { const texts = [document.body.innerText, ...[...document.querySelectorAll(
    '[placeholder], [title]')].flatMap(el => [el.placeholder || '', el.title || ''])];
    return texts.reduce((n, t) => n + t.split('--isolate').length - 1, 0); }"""


def test_the_page_says_once_that_chat_needs_a_non_isolated_server(page, isolated):
    proc, base = isolated
    sockets = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(base + "/")
    banner = page.wait_for_selector("#error:not([hidden])")
    assert "--isolate" in banner.inner_text()
    page.wait_for_selector("#conn[data-state=refused]")
    assert page.inner_text("#conn") == "chat unavailable"
    for control in ("#composer-input", "#send", "#attach", "#new-session", "#session-search"):
        assert page.is_disabled(control), control
    assert page.evaluate(SAID) == 1  # the banner alone gives the reason, not three places
    assert page.inner_text("#session-list") == "No chats on this server."  # not a bare list
    assert page.get_attribute("#composer-input", "placeholder") == "Chat unavailable"
    assert page.locator(".empty-hint").count() == 0  # no "Ask anything" over a dead chat
    page.set_viewport_size({"width": 390, "height": 844})  # on a phone, with the drawer open
    page.click("#sidebar-toggle")
    assert page.evaluate(SAID) == 1
    page.keyboard.press("Escape")
    page.set_viewport_size({"width": 1200, "height": 820})
    page.wait_for_timeout(2500)  # a retry loop (0.5 s, 1 s, 2 s backoff) would show by now
    assert page.is_visible("#error") and "--isolate" in page.inner_text("#error")  # it stays
    assert sockets == []
    page.click("nav >> text=Status")  # the rest of the page works
    page.wait_for_selector("#status-model table")
    assert page.console.errors == []
    assert not [line for line in proc.lines if "handshake" in line or "ERROR" in line]


def test_quantize_then_serve_loads_the_result_in_the_pool_and_it_chats(page, isolated):
    proc, base = isolated
    page.goto(base + "/#quantize")
    page.wait_for_selector(f"#q-model option[value='{MODEL}']", state="attached")
    page.wait_for_selector("#q-check[data-ok='1']")
    page.click("#q-form button[type=submit]")
    page.wait_for_selector("#view-quantize .job-panel[data-state=running]", timeout=60_000)
    # the parent scans its library now (as a Status page polling /v1/models would), before
    # the result exists: Serve must find the model all the same
    assert "4bit" not in httpx.get(base + "/v1/models").text  # fresh for 30 s (ttl_s)
    page.wait_for_selector("#view-quantize .job-panel[data-state=done]", timeout=120_000)
    name = f"{MODEL}-4bit"
    page.wait_for_selector("#view-quantize .lab-listed")
    assert page.inner_text("#view-quantize .lab-listed") == f"{name} is in your library."
    page.click(f"#view-quantize .job-result button >> text=Serve {name}")
    said = page.wait_for_selector("#view-quantize .serve-note:not(:empty)")
    assert said.get_attribute("data-state") in ("loading", "resident"), said.inner_text()
    note = page.wait_for_selector("#view-quantize .serve-note[data-state=resident]",
                                  timeout=120_000)
    assert note.inner_text() == (f"{name} is loaded in this server's model pool: requests that"
                                 f' name it ("model": "{name}") are answered by it.')
    row = httpx.get(f"{base}/v1/models/{name}").json()
    assert row["state"] == "resident"
    resident = {e["model"] for e in httpx.get(base + "/engine").json()["pool"]["resident"]}
    assert name in resident and len(resident) == 2  # next to the default, no restart
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
    answer = client.chat.completions.create(model=name, max_tokens=4, temperature=0,
                                            messages=[{"role": "user", "content": "Hello"}])
    assert answer.model == name and answer.usage.completion_tokens > 0
    assert page.console.errors == []
