"""An MCP tool's approval card in a real browser: the web chat with the suite's MCP server
(tests/mcp_fixture_server.py over stdio) configured; a scripted model calls its tool, the
card names the server, the tool and the arguments, Allow once runs it and its result
shows on the tool's card."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mlxbun_core.config.mcp import McpServerSpec
from mlxbun_core.webapp.state import of as web_state
from scripted_model import scripted_server

pytestmark = pytest.mark.browser

FIXTURE = Path(__file__).parent.parent / "mcp_fixture_server.py"


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_allow_once_runs_the_mcp_tool_and_shows_its_result(page, tmp_path):
    log = tmp_path / "fixture.log"
    spec = McpServerSpec("fx", 1, command=sys.executable, args=(str(FIXTURE), "stdio"),
                         env={"FIXTURE_LOG": str(log)}, timeout=20)
    with scripted_server("", name="scripted-browser-mcp") as (srv, plugin):
        web_state(srv.server.config.app).mcp_servers = {"fx": spec}
        replies = [call("fx__echo", text="from the browser")]
        plugin.reply = lambda prompt: replies.pop(0) if replies else "Done."
        page.goto(srv.base_url + "/")
        page.wait_for_selector("#conn[data-state=open]")
        page.fill("#composer-input", "echo something")
        page.keyboard.press("Enter")
        page.wait_for_selector(".approval-card .approval-actions button:not([disabled])",
                               timeout=60_000)
        card = page.locator(".approval-card").last
        text = card.inner_text()
        assert "Call echo on MCP server fx" in text and "at most 20 s" in text
        assert "from the browser" in card.locator(".approval-command").inner_text()
        assert not log.exists() or "echo" not in log.read_text()  # nothing ran before the click
        card.get_by_role("button", name="Allow once").click()
        assert "Allowed once." in card.inner_text()
        result = page.locator(".tool-result", has_text="echo: from the browser")
        result.wait_for(state="attached", timeout=60_000)
        page.wait_for_function(
            "() => !document.querySelector('.msg.assistant.streaming')", timeout=60_000)
        # the card opens on a click. The history frame that follows a turn draws the chat
        # again with its cards closed, and may land after the click: open it again then
        visible = False
        for _ in range(50):
            card_of_result = result.locator("xpath=ancestor::details[1]")
            if not card_of_result.evaluate("d => d.open"):
                card_of_result.locator("summary").click()
            page.wait_for_timeout(100)
            visible = result.is_visible()
            if visible:
                break
        assert visible
        assert "echo from the browser" in log.read_text().splitlines()
        assert page.console.errors == []
