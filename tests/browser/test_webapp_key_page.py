"""The page against a server started with ``--api-key``, in headless Chromium: it asks for
the key once, then the chat socket opens and the lab and Memory pages work with it (a
quantize job followed through its SSE stream, a dataset inspected, the vault set up and a
dry-run synthesis streamed): the streams are read with fetch, so the key goes as a header.
The refusals themselves are checked at the HTTP level (tests/test_webapp_key.py)."""

from __future__ import annotations

import json

import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import environ
from mlxbun_core.testing.server import start_server

pytestmark = pytest.mark.browser

KEY = "page-key"
ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    root = tmp_path_factory.mktemp("page-key")
    (root / "data.jsonl").write_text(json.dumps(ROW) + "\n")
    with environ(MLXBUN_HOME=str(root / "home"), MLXBUN_WIKI=str(root / "wiki")):
        srv = start_server(tiny_checkpoint("llama"), api_key=KEY, max_tokens=4,
                           sessions_dir=root / "sessions")
        srv.data = root / "data.jsonl"
        try:
            yield srv
        finally:
            srv.stop()


def test_the_page_asks_for_the_key_then_lab_and_memory_work_with_it(page, keyed):
    refused, missing = [], []
    page.on("response", lambda r: refused.append(r.url) if r.status == 401 else None)
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.goto(keyed.base_url + "/")
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")  # saves the key, reloads
    page.wait_for_selector("#conn[data-state=open]")  # the socket took ?api_key=
    asked = len(refused)
    assert asked >= 1  # the first load was refused: that is what opened the dialog

    page.goto(keyed.base_url + "/#dataset")
    page.wait_for_selector("#view-dataset:not([hidden])")
    page.fill("#ds-data-path", str(keyed.data))
    page.press("#ds-data-path", "Enter")
    page.wait_for_selector("#view-dataset .inspect-verdict")
    assert "train rows\t1" in page.inner_text("#view-dataset .inspect-summary")

    page.goto(keyed.base_url + "/#quantize")
    page.fill("#q-model-path", str(keyed.engine.model.path))
    page.dispatch_event("#q-model-path", "change")
    page.wait_for_selector("#q-check[data-ok='1']")
    page.select_option("#q-bits", "8")
    page.click("#q-form button[type=submit]")
    page.wait_for_selector("#view-quantize .job-panel[data-state=done]", timeout=120_000)
    assert page.evaluate("document.querySelector('#view-quantize .job-panel progress').value") == 1

    page.goto(keyed.base_url + "/#memory")
    page.click("#memory-init")
    page.wait_for_selector("#memory-kv")
    page.click("#memory-preview")
    page.wait_for_selector("#memory-synth-note[data-kind=done]", timeout=60_000)
    assert "nothing written" in page.inner_text("#memory-synth-note")
    assert len(refused) == asked and not page.is_visible("#key-dialog")  # never asked again
    # the console's errors are the 401s that asked for the key; no vault yet is no 404
    assert missing == []
    assert [e for e in page.console.errors if "status of 401" not in e] == []
