"""The dashboard in headless Chromium against a real `goodput serve` seeded by `goodput simulate`.

Every number compared here is read from the page and from the API for the same run, and formatted by
dashboards.format: what the page shows is what the API says. Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import pytest

from services import presentation as fmt
from services.presentation import CATEGORIES, LABELS
from tests.dashboards.conftest import SEEDED_RUNS, STALLED_RUN, Page, Server

pytestmark = pytest.mark.browser

ALL_RUNS = [*SEEDED_RUNS, STALLED_RUN]


def open_fleet(tab: Page, server: Server, query: str = "") -> None:
    tab.page.goto(server.dashboard + query)
    tab.page.wait_for_selector("#fleet-kpi-goodput", state="visible")


def open_run(tab: Page, server: Server, run_id: str) -> None:
    tab.page.goto(f"{server.dashboard}runs/{quote(run_id, safe='')}")
    tab.page.wait_for_selector("#run-kpi-goodput", state="visible")
    tab.page.wait_for_selector("#run-timeline-graph .main-svg")


def text(tab: Page, selector: str) -> str:
    return str(tab.page.inner_text(selector)).strip()


def _number(shown: str) -> float:
    match = re.search(r"-?[\d,]*\.?\d+", shown)
    assert match, shown
    return float(match.group().replace(",", ""))


def assert_shows(tab: Page, selector: str, before: str, after: str) -> None:
    """The page shows `before` == `after`, or, for a figure that grows while a run is hung (provisional hang,
    booked up to the moment each answer was made), a value between the API's answers before and after the page
    fetched its own."""
    shown = text(tab, selector)
    if before == after:
        assert shown == before, selector
        return
    low, high = sorted((_number(before), _number(after)))
    assert low <= _number(shown) <= high, (selector, shown, before, after)


def table_run_ids(tab: Page) -> list[str]:
    return [row.get_attribute("data-run-id") for row in tab.page.query_selector_all("tr[data-run-id]")]


def wait_for_rows(tab: Page, expected: list[str]) -> None:
    tab.page.wait_for_function(
        "ids => JSON.stringify([...document.querySelectorAll('tr[data-run-id]')].map(r => r.dataset.runId)) "
        "=== JSON.stringify(ids)", arg=expected, timeout=30_000)


def fleet_expectations(runs: list[dict[str, Any]]) -> dict[str, str]:
    """The fleet cards, in the one unit the allocated total calls for."""
    allocated = sum(r["allocated_gpu_seconds"] for r in runs)
    productive = sum(r["productive_gpu_seconds"] for r in runs)
    unit = fmt.gpu_time_unit(allocated)
    out = {
        "#fleet-kpi-goodput": fmt.percent(productive / allocated),
        "#fleet-kpi-allocated": fmt.gpu_time(allocated, unit),
        "#fleet-kpi-wasted": fmt.gpu_time(sum(sum(r["waste_gpu_seconds"].values()) for r in runs), unit),
    }
    for c in CATEGORIES:
        out[f"#fleet-kpi-waste-{c}"] = fmt.gpu_time(sum(r["waste_gpu_seconds"][c] for r in runs), unit)
    return out


def test_fleet_page_shows_the_apis_numbers_worst_run_first(seeded_server: Server, tab: Page) -> None:
    before = fleet_expectations(seeded_server.get("/v1/runs")["runs"])
    open_fleet(tab, seeded_server)
    runs = seeded_server.get("/v1/runs")["runs"]
    assert sorted(r["run_id"] for r in runs) == sorted(ALL_RUNS)
    for selector, expected in fleet_expectations(runs).items():
        assert_shows(tab, selector, before[selector], expected)

    worst_first = sorted(runs, key=lambda r: (-sum(r["waste_gpu_seconds"].values()), r["run_id"]))
    assert table_run_ids(tab) == [r["run_id"] for r in worst_first]
    unit = fmt.gpu_time_unit(*(r["allocated_gpu_seconds"] for r in runs))  # one unit for the table
    for run in runs:
        row = f'tr[data-run-id="{run["run_id"]}"]'
        if run.get("provisional"):  # still hung: its figures grow between reads (bracketed above)
            continue
        assert text(tab, f"{row} td.cell-goodput") == fmt.percent(run["goodput"])
        assert text(tab, f"{row} td.cell-allocated") == fmt.gpu_time(run["allocated_gpu_seconds"], unit)
        assert text(tab, f"{row} td.cell-wasted") == fmt.gpu_time(sum(run["waste_gpu_seconds"].values()), unit)
        titles = [s.get_attribute("title") for s in tab.page.query_selector_all(f"{row} .stacked .seg")]
        for c in CATEGORIES:
            value = run["waste_gpu_seconds"][c]
            if value > 0:
                share = fmt.share(value, run["allocated_gpu_seconds"])
                assert f"{LABELS[c]}: {fmt.gpu_time(value, unit)} ({share})" in titles, (run["run_id"], c)

    stalled = f'tr[data-run-id="{STALLED_RUN}"]'
    assert "possibly hung" in text(tab, stalled)
    assert "ago" in text(tab, 'tr[data-run-id="resnet-live"]')
    tab.page.wait_for_selector("#fleet-over-time-graph .main-svg")
    tab.page.wait_for_selector("#fleet-runs-graph .main-svg")
    tab.screenshot("fleet")
    assert tab.errors == []


def test_fleet_filters_by_status_and_run_id(seeded_server: Server, tab: Page) -> None:
    open_fleet(tab, seeded_server)
    failed = [r["run_id"] for r in seeded_server.get("/v1/runs", status="failed")["runs"]]
    assert failed == ["llama-70b-pretrain"]

    tab.choose("fleet-status-filter", "Failed")
    wait_for_rows(tab, failed)
    assert text(tab, "#fleet-kpi-allocated") == fmt.gpu_time(
        sum(r["allocated_gpu_seconds"] for r in seeded_server.get("/v1/runs", status="failed")["runs"]))

    assert "status=failed" in tab.page.url  # the filter is in the address (a reload keeps it)

    open_fleet(tab, seeded_server)  # the page's own address: status back to any
    tab.page.fill("#fleet-run-filter", "hang")  # no Enter: the run id filters as it is typed
    wait_for_rows(tab, ["gpt-small-hang"])
    tab.screenshot("fleet-filtered")

    tab.page.fill("#fleet-run-filter", "no-such-run")
    tab.page.wait_for_selector("text=No runs match these filters")
    assert tab.errors == []


def test_clicking_a_run_opens_its_page(seeded_server: Server, tab: Page) -> None:
    open_fleet(tab, seeded_server)
    tab.page.click('tr[data-run-id="gpt-small-hang"] a.run-link')
    tab.page.wait_for_url(re.compile(r".*/dashboard/runs/gpt-small-hang\?project=default$"))  # (project, run id)
    tab.page.wait_for_selector("#run-kpi-goodput", state="visible")
    ledger = seeded_server.get("/v1/runs/gpt-small-hang/waste")
    assert text(tab, "#run-kpi-goodput") == fmt.percent(ledger["goodput"])
    tab.page.click("text=← Fleet")
    tab.page.wait_for_selector("#fleet-kpi-goodput", state="visible")
    assert tab.errors == []


@pytest.mark.parametrize("run_id", ALL_RUNS)
def test_run_page_shows_the_ledger_of_the_api(seeded_server: Server, tab: Page, run_id: str) -> None:
    first = seeded_server.get(f"/v1/runs/{run_id}/waste")
    open_run(tab, seeded_server, run_id)
    ledger = seeded_server.get(f"/v1/runs/{run_id}/waste")
    allocated = ledger["allocated_gpu_seconds"]
    u0, u1 = fmt.gpu_time_unit(first["allocated_gpu_seconds"]), fmt.gpu_time_unit(allocated)  # one per card row
    assert_shows(tab, "#run-kpi-goodput", fmt.percent(first["goodput"]), fmt.percent(ledger["goodput"]))
    assert_shows(tab, "#run-kpi-allocated", fmt.gpu_time(first["allocated_gpu_seconds"], u0),
                 fmt.gpu_time(allocated, u1))
    assert_shows(tab, "#run-kpi-productive", fmt.gpu_time(first["productive_gpu_seconds"], u0),
                 fmt.gpu_time(ledger["productive_gpu_seconds"], u1))
    for c in CATEGORIES:
        value = ledger["waste_gpu_seconds"][c]
        assert_shows(tab, f"#run-kpi-waste-{c}", fmt.gpu_time(first["waste_gpu_seconds"][c], u0),
                     fmt.gpu_time(value, u1))
        assert_shows(tab, f"#run-kpi-waste-{c}-note",
                     fmt.share(first["waste_gpu_seconds"][c], first["allocated_gpu_seconds"]),
                     fmt.share(value, allocated))
    for graph in ("#run-ledger-graph", "#run-ranks-graph", "#run-heatmap-graph"):
        tab.page.wait_for_selector(f"{graph} .main-svg")
    tab.page.wait_for_timeout(300)  # let plotly finish laying out before the screenshot
    tab.screenshot(f"run-{run_id}")
    assert tab.errors == []


def test_failing_run_lists_its_restarts_with_the_ledgers_costs(seeded_server: Server, tab: Page) -> None:
    run_id = "llama-70b-pretrain"
    open_run(tab, seeded_server, run_id)
    ledger = seeded_server.get(f"/v1/runs/{run_id}/waste")
    restarts = seeded_server.get(f"/v1/runs/{run_id}/restarts")["restarts"]
    assert len(restarts) == ledger["restarts"] == 2  # three failures, the last one ends the run
    body = text(tab, "#run-restart-table")
    unit = fmt.gpu_time_unit(*(r[k] for r in restarts for k in ("rework_gpu_seconds", "hang_gpu_seconds",
                                                                 "startup_gpu_seconds")))
    for r in restarts:
        assert fmt.gpu_time(r["rework_gpu_seconds"], unit) in body
        assert fmt.gpu_time(r["startup_gpu_seconds"], unit) in body
    checkpoints = text(tab, "#run-checkpoint-table")
    assert f"{ledger['checkpoints']['count']:,} checkpoints" in checkpoints
    assert tab.errors == []


def test_straggler_rank_is_named_and_highlighted(seeded_server: Server, tab: Page) -> None:
    open_run(tab, seeded_server, "bert-finetune-straggler")
    ranks = seeded_server.get("/v1/runs/bert-finetune-straggler/ranks")["ranks"]
    assert ranks["straggler_ranks"] == [5]
    ledger = seeded_server.get("/v1/runs/bert-finetune-straggler/waste")
    note = text(tab, "#run-ranks-note")
    assert "rank 5" in note and fmt.gpu_time(ledger["waste_gpu_seconds"]["straggler"]) in note
    assert tab.page.query_selector("#run-ranks-graph text.annotation-text") is not None


def test_live_runs_show_progress_and_the_stalled_one_is_flagged(seeded_server: Server, tab: Page) -> None:
    open_run(tab, seeded_server, STALLED_RUN)
    banner = text(tab, "#run-live-banner")
    live = seeded_server.get(f"/v1/runs/{STALLED_RUN}/live")
    assert live["possibly_hung"] is True
    assert banner.startswith("Possibly hung.")
    assert f"{fmt.gpu_time(live['at_risk_gpu_seconds'])} at risk" in banner
    tab.screenshot("run-stalled-live")

    open_run(tab, seeded_server, "resnet-live")
    banner = text(tab, "#run-live-banner")
    assert banner.startswith("Running.") and "Last progress" in banner
    assert tab.errors == []


def test_unknown_run_says_so_without_a_traceback(seeded_server: Server, tab: Page) -> None:
    tab.page.goto(f"{seeded_server.dashboard}runs/no-such-run")
    tab.page.wait_for_selector("text=No run 'no-such-run'")
    assert "Traceback" not in tab.page.content()
    assert tab.errors == []


def test_empty_collector_explains_how_to_send_events(empty_server: Server, tab: Page) -> None:
    tab.page.goto(empty_server.dashboard)
    tab.page.wait_for_selector("text=No runs yet")
    assert f"goodput simulate --url {empty_server.url}" in tab.page.inner_text("body")
    tab.screenshot("fleet-empty")
    assert tab.errors == []
