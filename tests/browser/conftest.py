"""Headless Chromium from the OS, driven through Playwright's Python API.

Playwright never downloads a browser here: the tests launch the system's Chromium
(``MLXBUN_CHROMIUM``, else ``chromium`` / ``chromium-browser`` / ``google-chrome`` on
PATH) with a fresh profile. Run them with ``make test-browser``.
"""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    wanted = os.environ.get("MLXBUN_CHROMIUM")
    for candidate in ([wanted] if wanted else ["chromium", "chromium-browser", "google-chrome"]):
        found = shutil.which(candidate)
        if found:
            return found
    pytest.fail("browser tests need Chromium: `apt-get install chromium` (Debian), or set "
                "MLXBUN_CHROMIUM to a Chromium/Chrome binary", pytrace=False)


@pytest.fixture(scope="session")
def playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def browser(playwright):
    b = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS,
                                   headless=True)
    yield b
    b.close()


@pytest.fixture
def profile_page(playwright, tmp_path):
    """A page in a browser with a real (not incognito) profile in a fresh directory:
    what installability needs."""
    context = playwright.chromium.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=chromium_path(), args=CHROMIUM_ARGS,
        headless=True, viewport={"width": 1200, "height": 820})
    pg = context.pages[0] if context.pages else context.new_page()
    pg.console = Console(pg)
    yield pg
    context.close()


class Console:
    """Console errors and uncaught exceptions of a page."""

    def __init__(self, page):
        self.errors: list = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))


@pytest.fixture
def page(browser):
    """A fresh context (no cookies, storage or service worker) and its page."""
    context = browser.new_context(viewport={"width": 1200, "height": 820})
    pg = context.new_page()
    pg.console = Console(pg)
    yield pg
    context.close()
