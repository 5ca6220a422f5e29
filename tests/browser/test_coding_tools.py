"""The coding tools' approval card in a real browser: a scripted model asks to write and
edit files; the user denies, allows once, always allows and revokes, by clicking."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scripted_model import scripted_server

pytestmark = pytest.mark.browser


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def script(plugin, *replies: str) -> None:
    queue = list(replies)
    plugin.reply = lambda prompt: queue.pop(0) if queue else "Done."


@pytest.fixture(scope="module")
def scripted():
    with scripted_server("", name="scripted-browser-coding") as pair:
        yield pair


def ask(page, plugin, text: str, *replies: str) -> None:
    script(plugin, *replies)
    page.fill("#composer-input", text)
    page.keyboard.press("Enter")
    page.wait_for_selector(".approval-card .approval-actions button:not([disabled])")


def settled(page, answers: int) -> None:
    page.wait_for_function(
        "n => !document.querySelector('.msg.assistant.streaming')"
        " && document.querySelectorAll('.msg.assistant').length >= n", arg=answers, timeout=60_000)


def test_the_approval_card_denies_allows_and_always_allows(page, scripted, tmp_path):
    srv, plugin = scripted
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "a.txt"
    target.write_text("hello\n")
    page.goto(srv.base_url + "/")
    page.wait_for_selector("#conn[data-state=open]")
    page.click("#settings-toggle")
    page.fill("#coding-folder", str(ws))
    page.check("#coding-enabled")
    page.wait_for_function("() => document.getElementById('coding-note').textContent"
                           ".startsWith('On in')")
    page.click("#settings-toggle")  # closed again: the chat has the room

    ask(page, plugin, "change a.txt", call("write", path="a.txt", content="bye\n"))
    card = page.locator(".approval-card").last
    assert "+bye" in card.locator(".diff-add").all_inner_texts()[0]
    assert "1 call waits" in page.inner_text("#approval-queue")
    out = Path(os.environ.get("MLXBUN_SCREENSHOT_DIR") or tmp_path)
    page.screenshot(path=str(out / "webapp-coding.png"))
    card.get_by_role("button", name="Deny").click()
    settled(page, 1)
    assert target.read_text() == "hello\n"
    assert page.locator("#approval-queue").is_hidden()

    ask(page, plugin, "change it, really", call("write", path="a.txt", content="bye\n"))
    page.keyboard.press("Enter")  # the card's first button, Allow once, has the focus
    settled(page, 2)
    assert target.read_text() == "bye\n"

    ask(page, plugin, "edit it", call("edit", path="a.txt", old_string="bye", new_string="ciao"))
    page.locator(".approval-card").last.get_by_role("button", name="Always allow edit").click()
    settled(page, 3)
    assert target.read_text() == "ciao\n"
    page.click("#settings-toggle")
    page.wait_for_selector("#coding-always >> text=edit")
    page.get_by_role("button", name="Stop always allowing edit").click()
    page.wait_for_selector("#coding-always >> text=none")
    page.click("#settings-toggle")

    page.set_viewport_size({"width": 390, "height": 800})  # a phone: the card fits
    ask(page, plugin, "once more", call("bash", command="echo hi"))
    card = page.locator(".approval-card").last
    assert "echo hi" in card.locator(".approval-command").inner_text()
    for name in ("Allow once", "Always allow bash", "Deny"):
        box = card.get_by_role("button", name=name).bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, name
    box = card.bounding_box()
    assert box and box["x"] + box["width"] <= 390
    assert page.evaluate("(m => m.scrollWidth <= m.clientWidth)"
                         "(document.getElementById('messages'))")
    card.get_by_role("button", name="Deny").click()
    settled(page, 4)
    assert page.console.errors == []
