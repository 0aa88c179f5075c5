"""The fleet page for a team, in headless Chromium against a real `goodput serve`: a time range cuts each run's figures
to it, the filters live in the address (a reload keeps them), the table sorts and pages past its first rows, runs
compare side by side. The numbers are read from the page and checked against the API."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from services import presentation as fmt
from services.simulate import SimConfig, simulate
from tests.dashboards.conftest import Page, Server, start_server, stop_server
from tests.dashboards.test_browser import open_fleet as open_fleet_page
from tests.dashboards.test_browser import text

pytestmark = pytest.mark.browser

LONG_RUN, LONG_GPUS = "pretrain-long", 8  # ~3 h of GPU time ending now: its last hour is a third of it
SMALL_RUNS = [f"sweep-{i:02d}" for i in range(30)]  # 2 GPUs, a few minutes each: more runs than a page holds
SORT_BY_ALLOCATED = """[id*='"column":"allocated"']"""  # the "Allocated" header (a pattern-matching id)


def ending_now(**config: Any) -> SimConfig:
    """A simulated run whose last event is a minute ago (its length, failures included, measured first)."""
    probe = simulate(SimConfig(**config, start_time=0.0)).events
    span = max(e["time"] for e in probe) - min(e["time"] for e in probe)
    return SimConfig(**config, start_time=time.time() - 60.0 - span)


def post_run(url: str, config: SimConfig) -> None:
    events = simulate(config).events
    for i in range(0, len(events), 2000):
        response = httpx.post(f"{url}/v1/events", json={"events": events[i:i + 2000]}, timeout=120)
        assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def fleet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("fleet"))  # the default automatic refresh (5 s), as users have it
    try:
        now = time.time()
        post_run(server.url, ending_now(run_id=LONG_RUN, ranks=LONG_GPUS, hours=2.6, step_s=20.0, mtbf_s=2400.0,
                                        seed=7))
        for i, run_id in enumerate(SMALL_RUNS):
            post_run(server.url, SimConfig(run_id=run_id, ranks=2, hours=0.03 + 0.004 * i, step_s=2.0, mtbf_s=None,
                                           seed=100 + i, start_time=now - 1800 - 60 * i))
        yield server
    finally:
        stop_server(server)


def open_fleet(tab: Page, server: Server, query: str = "") -> None:
    open_fleet_page(tab, server, query)
    tab.page.wait_for_selector("tr[data-run-id]")


def gpu_seconds_shown(shown: str) -> float:
    """`12.34 GPU-h` -> GPU-seconds (the unit's size times the number)."""
    match = re.fullmatch(r"<?([\d,]*\.?\d+) (GPU-s|GPU-min|GPU-h)", shown)
    assert match, shown
    unit = {u.symbol: u for u in (fmt.GPU_SECONDS, fmt.GPU_MINUTES, fmt.GPU_HOURS)}[match.group(2)]
    return float(match.group(1).replace(",", "")) * unit.seconds


def row_ids(tab: Page) -> list[str]:
    return [str(r.get_attribute("data-run-id")) for r in tab.page.query_selector_all("tr[data-run-id]")]


def wait_rows(tab: Page, predicate_js: str, arg: Any = None) -> None:
    tab.page.wait_for_function(
        "([test, arg]) => { const ids = [...document.querySelectorAll('tr[data-run-id]')].map(r => r.dataset.runId);"
        " return ids.length > 0 && (new Function('ids', 'arg', test))(ids, arg); }",
        arg=[predicate_js, arg], timeout=30_000)


def query_of(tab: Page) -> dict[str, list[str]]:
    return parse_qs(urlparse(tab.page.url).query)


def test_a_one_hour_range_never_shows_more_than_the_gpus_times_an_hour(fleet_server: Server, tab: Page) -> None:
    whole = {r["run_id"]: r for r in fleet_server.get("/v1/runs")["runs"]}
    assert whole[LONG_RUN]["allocated_gpu_seconds"] > 2.5 * LONG_GPUS * 3600  # its life: far more than an hour
    open_fleet(tab, fleet_server, "?range=1h")
    long_row = f'tr[data-run-id="{LONG_RUN}"]'
    tab.page.wait_for_selector(long_row)
    shown_long = gpu_seconds_shown(text(tab, f"{long_row} td.cell-allocated"))
    assert shown_long <= LONG_GPUS * 3600 * 1.001
    assert shown_long >= 0.9 * LONG_GPUS * 3600  # it ran all through the last hour
    gpus = LONG_GPUS + 2 * len(SMALL_RUNS)
    fleet_total = gpu_seconds_shown(text(tab, "#fleet-kpi-allocated"))
    assert fleet_total <= gpus * 3600 * 1.001
    cut = fleet_server.get("/v1/fleet/window", since=time.time() - 3600)
    api_total = sum(r["window"]["allocated_gpu_seconds"] for r in cut["runs"])
    assert fleet_total == pytest.approx(api_total, rel=0.02)  # the same cut the API makes (its clock moved on)
    assert "each run counts only its GPU time inside this range" in text(tab, "#fleet-range-note")

    tab.choose("fleet-range-filter", "All time")  # the long run's whole life again
    tab.page.wait_for_function(
        "v => document.querySelector('tr[data-run-id=\"" + LONG_RUN + "\"] td.cell-allocated').innerText === v",
        arg=fmt.gpu_time(whole[LONG_RUN]["allocated_gpu_seconds"], fmt.GPU_HOURS), timeout=30_000)
    tab.page.wait_for_selector("#fleet-over-time-graph .main-svg")
    assert tab.errors == []


def test_filters_live_in_the_address_and_survive_a_reload(fleet_server: Server, tab: Page) -> None:
    open_fleet(tab, fleet_server)
    tab.choose("fleet-range-filter", "Last 24 hours")
    tab.choose("fleet-status-filter", "Finished")
    tab.page.type("#fleet-run-filter", "sweep-1", delay=40)  # no Enter: it filters as you type
    assert tab.page.input_value("#fleet-run-filter") == "sweep-1"
    wait_rows(tab, "return ids.every(i => i.startsWith('sweep-1'))")
    expected = sorted(i for i in SMALL_RUNS if i.startswith("sweep-1"))
    assert sorted(row_ids(tab)) == expected
    allocated = {r["run_id"]: r["allocated_gpu_seconds"] for r in fleet_server.get("/v1/runs")["runs"]}
    by_allocated = sorted(expected, key=lambda r: (-allocated[r], r))  # all inside the range: whole allocations
    tab.page.click(SORT_BY_ALLOCATED)
    tab.page.wait_for_selector(".sort-button.sorted:has-text('Allocated ▼')")
    wait_rows(tab, "return ids.length === arg.length && ids.every((v, i) => v === arg[i])", by_allocated)
    tab.page.wait_for_function("() => location.search.includes('sort=allocated')")
    query = query_of(tab)
    assert query["range"] == ["24h"] and query["status"] == ["finished"] and query["run"] == ["sweep-1"]
    shown_before = row_ids(tab)

    tab.page.reload()
    tab.page.wait_for_selector("#fleet-kpi-goodput", state="visible")
    wait_rows(tab, "return ids.length === arg.length && ids.every((v, i) => v === arg[i])", shown_before)
    assert tab.page.input_value("#fleet-run-filter") == "sweep-1"
    assert "Last 24 hours" in text(tab, "#fleet-range-filter") and "Finished" in text(tab, "#fleet-status-filter")
    assert "▼" in text(tab, "table.runs-table thead")  # still sorted by allocated, biggest first
    assert query_of(tab) == query
    tab.screenshot("fleet-filtered-url")
    assert tab.errors == []


def test_the_table_sorts_by_a_column_and_pages_through_every_run(fleet_server: Server, tab: Page) -> None:
    runs = fleet_server.get("/v1/fleet/window")["runs"]
    assert len(runs) == 1 + len(SMALL_RUNS) > 25
    open_fleet(tab, fleet_server)
    assert len(row_ids(tab)) == 25
    assert "of 31" in text(tab, "#fleet-page-info")

    tab.page.click(SORT_BY_ALLOCATED)  # biggest first
    by_allocated = [r["run"]["run_id"] for r in sorted(
        runs, key=lambda r: (-r["window"]["allocated_gpu_seconds"], r["run"]["run_id"]))]
    wait_rows(tab, "return ids[0] === arg", by_allocated[0])
    assert row_ids(tab)[0] == LONG_RUN
    tab.page.click(SORT_BY_ALLOCATED)  # again: smallest first
    wait_rows(tab, "return ids[0] === arg", by_allocated[-1])
    first_page = row_ids(tab)
    assert first_page == by_allocated[::-1][:25]

    tab.page.click("#fleet-page-next")
    wait_rows(tab, "return ids.length === 6")
    assert row_ids(tab) == by_allocated[::-1][25:]
    assert text(tab, "#fleet-page-info").startswith("Runs 26–31 of 31")
    assert tab.page.is_disabled("#fleet-page-next") and query_of(tab)["page"] == ["2"]
    tab.page.click("#fleet-page-prev")
    wait_rows(tab, "return ids.length === 25")
    assert row_ids(tab) == first_page

    tab.choose("fleet-page-size", "50", exact=True)
    wait_rows(tab, "return ids.length === 31")
    assert sorted(row_ids(tab)) == sorted([LONG_RUN, *SMALL_RUNS])  # every run, none left out
    assert tab.errors == []


def test_a_refresh_redraws_the_rows_but_never_the_sort_buttons(fleet_server: Server, tab: Page) -> None:
    """A click on a header that a refresh is replacing is lost: the header buttons must be the same elements after
    every refresh, only their labels change."""
    open_fleet(tab, fleet_server)
    tab.page.wait_for_selector(SORT_BY_ALLOCATED)
    tab.page.evaluate("s => { document.querySelector(s).__drawnOnce = true; }", SORT_BY_ALLOCATED)
    for _ in range(2):  # two automatic refreshes (the page says when it was last updated, to the second)
        before = text(tab, "#fleet-updated")
        tab.page.wait_for_function("b => document.querySelector('#fleet-updated').innerText.trim() !== b", arg=before,
                                   timeout=30_000)
    assert tab.page.evaluate("s => document.querySelector(s).__drawnOnce === true", SORT_BY_ALLOCATED)
    for arrow in ("▼", "▲", "▼"):  # each click turns the order around, refreshes or not
        tab.page.click(SORT_BY_ALLOCATED)
        tab.page.wait_for_selector(f".sort-button.sorted:has-text('Allocated {arrow}')", timeout=30_000)
    assert tab.page.evaluate("s => document.querySelector(s).__drawnOnce === true", SORT_BY_ALLOCATED)
    assert tab.errors == []


def test_two_runs_compare_side_by_side_and_the_page_is_screenshot(fleet_server: Server, tab: Page) -> None:
    open_fleet(tab, fleet_server, f"?range=24h&compare=default/{LONG_RUN}&compare=default/{SMALL_RUNS[0]}")
    tab.page.wait_for_selector("#fleet-compare-table")
    heads = [h.inner_text().strip() for h in tab.page.query_selector_all("#fleet-compare-table thead th")][1:]
    assert heads == [LONG_RUN, SMALL_RUNS[0]]
    tab.page.wait_for_selector("#fleet-compare-graph .main-svg")
    tab.page.wait_for_selector("#fleet-trend-graph .main-svg")
    tab.page.wait_for_selector("#fleet-over-time-graph .main-svg")
    tab.page.wait_for_timeout(400)  # let plotly finish laying out
    tab.screenshot("fleet-team")
    assert tab.errors == []


def test_grouped_by_project_the_page_adds_up_each_project(fleet_server: Server, tab: Page) -> None:
    open_fleet(tab, fleet_server, "?group=project&range=all")
    row = tab.page.wait_for_selector('#fleet-projects tr[data-project="default"]')
    assert row is not None and "31" in row.inner_text()
    runs = fleet_server.get("/v1/runs")["runs"]
    unit = fmt.gpu_time_unit(sum(r["allocated_gpu_seconds"] for r in runs))
    assert text(tab, '#fleet-projects tr[data-project="default"] td.cell-allocated') == fmt.gpu_time(
        sum(r["allocated_gpu_seconds"] for r in runs), unit)
    assert text(tab, "#fleet-runs-title") == "Runs by project"
    assert tab.errors == []
