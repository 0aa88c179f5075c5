"""The dashboard shows a run id carrying HTML, script and SQL as text: in headless Chromium the literal text is
on the page, and no element or dialog came of it (the injection strings are those of tests/fuzz/test_injection.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.dashboards.conftest import Page, start_server, stop_server
from tests.fuzz.test_injection import RUN_ID, _events

pytestmark = pytest.mark.browser


def test_the_dashboard_shows_injection_strings_as_text(tmp_path, tab: Page) -> None:
    server = start_server(tmp_path)
    dialogs: list[str] = []

    def dismiss(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    tab.page.on("dialog", dismiss)
    try:
        assert httpx.post(f"{server.url}/v1/events", json={"events": _events()}, timeout=60).status_code == 200
        tab.page.goto(server.dashboard)
        tab.page.wait_for_selector("tr[data-run-id]")
        assert tab.page.get_by_text(RUN_ID, exact=False).count() >= 1
        tab.page.goto(f"{server.dashboard}runs/{quote(RUN_ID, safe='')}")
        tab.page.wait_for_selector("#run-kpi-goodput", state="visible")
        tab.page.wait_for_timeout(1500)
        assert RUN_ID in tab.page.inner_text("body")
        assert tab.page.evaluate("() => document.querySelectorAll('img[src=\"x\"]').length") == 0
        inline_scripts = tab.page.evaluate(
            "() => [...document.querySelectorAll('script:not([src])')].filter(s => s.textContent.includes('alert'))"
            ".length")
        assert inline_scripts == 0
        assert not dialogs, dialogs
    finally:
        stop_server(server)
