"""The startup split reads the same in the CLI's ledger, the run page's card and the report's table (figures from
the hand-worked scenario of tests/analysis/test_startup_parts.py)."""

from __future__ import annotations

import httpx
import pytest

from dashboards.components import run_parts
from services import presentation as fmt
from services.api_client import ApiClient
from services.cli.output import print_ledger
from services.reports.content import build_breakdown
from services.reports.html import _breakdown_table
from tests.analysis.test_startup_parts import W, two_attempts
from tests.dashboards.test_run_page_parts import flat_text
from tests.ledger_checks import ledger_of_events


def test_the_cli_page_and_report_show_the_startup_parts_largest_first(capsys: pytest.CaptureFixture[str]) -> None:
    ledger = ledger_of_events(two_attempts())
    split = fmt.startup_split(ledger.startup_parts)
    assert split[0] == ("relaunch", 18.0 * W) and {label for label, _ in split} == {
        "relaunch", "rendezvous", "checkpoint load", "before the first step", "not split (no marker)"}
    api = ApiClient("http://c", http=httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=ledger.model_dump(mode="json")))))
    assert print_ledger(api, "s1") == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("startup "))
    assert [line.split()[:2] for line in lines[at + 1: at + 3]] == [["relaunch", "72"], ["rendezvous", "60"]]
    cards = flat_text(run_parts.kpis(ledger))
    unit = fmt.gpu_time_unit(ledger.allocated_gpu_seconds)
    assert "Startup: relaunch" in cards and f"checkpoint load {fmt.gpu_time(15.0 * W, unit)}" in cards
    table = _breakdown_table(build_breakdown(ledger), unit, split)
    assert table.count('<tr class="part">') == 5 and "checkpoint load" in table
