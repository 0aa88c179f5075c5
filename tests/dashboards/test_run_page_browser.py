"""The run page says what to do, in headless Chromium against a real `goodput serve` holding seven kinds of run
(restarts, a straggler, a hang, a healthy run, a failed run on 24 of 32 GPUs, a live run and a live run gone silent,
all in one project, so each run's advice weighs the others' failures).

The page's recommendations are the advice engine's, word for word and figure for figure: one test reads them from
the page, `goodput advise`, GET /v1/runs/{id}/advice and the JSON report of the same run and compares all four. A rank
opens as a drill-down whose address survives a reload. Screenshots go to artifacts/screenshots/ (docs/images/ has
copies).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from services import presentation as fmt
from services.presentation import advice_stake, no_advice
from services.schemas.advice import Recommendation, RunAdvice
from tests.dashboards.conftest import GOODPUT, SCREENSHOTS, Page, Server, _env, server_with_runs

pytestmark = pytest.mark.browser

RESTARTS, STRAGGLER, HANG, HEALTHY = "llama-restarts", "bert-straggler", "gpt-hang", "resnet-healthy"
IDLE_GPUS, LIVE, SILENT = "t5-24-of-32", "vit-live", "vit-silent"
SEVEN_RUNS: dict[str, list[str]] = {
    RESTARTS: ["--ranks", "16", "--hours", "0.4", "--mtbf", "400", "--end", "finished", "--seed", "3"],
    STRAGGLER: ["--ranks", "16", "--hours", "0.3", "--mtbf", "0", "--straggler-rank", "5", "--seed", "1"],
    HANG: ["--ranks", "8", "--hours", "0.25", "--mtbf", "0", "--hang-at-step", "400", "--seed", "2"],
    HEALTHY: ["--ranks", "8", "--hours", "0.3", "--mtbf", "0", "--seed", "6"],
    IDLE_GPUS: ["--ranks", "24", "--gpus", "32", "--hours", "0.2", "--mtbf", "500", "--end", "failed",
                "--max-failures", "2", "--seed", "7"],
    LIVE: ["--ranks", "8", "--hours", "0.4", "--mtbf", "0", "--end", "running", "--seed", "4"],
}


@pytest.fixture(scope="module")
def seven_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_with_runs(tmp_path_factory.mktemp("seven"), SEVEN_RUNS, SILENT) as server:
        yield server


def run_url(server: Server, run_id: str, query: str = "") -> str:
    return f"{server.dashboard}runs/{quote(run_id, safe='')}{query}"


def open_run(tab: Page, server: Server, run_id: str, query: str = "") -> None:
    tab.page.goto(run_url(server, run_id, query))
    tab.page.wait_for_selector("#run-kpi-goodput", state="visible")
    tab.page.wait_for_selector("#run-advice-measured", state="visible", timeout=60_000)


def inner(tab: Page, selector: str) -> list[str]:
    return [" ".join(str(e.inner_text()).split()) for e in tab.page.query_selector_all(selector)]


def page_advice(tab: Page) -> list[dict[str, Any]]:
    """Each recommendation as the page shows it (its details opened first, so every text is visible)."""
    out = []
    for item in tab.page.query_selector_all("#run-advice-list > li"):
        item.eval_on_selector("details", "d => d.open = true")

        def one(selector: str, item: Any = item) -> str:
            return " ".join(str(item.query_selector(selector).inner_text()).split())

        out.append({"code": str(item.get_attribute("id")).removeprefix("run-advice-"),
                    "title": one(".advice-title"), "stake": one(".advice-stake"), "wording": one(".advice-wording"),
                    "prediction": one(".advice-prediction"), "model": one(".advice-model"),
                    "confidence": one(".advice-confidence"),
                    "evidence": [" ".join(str(e.inner_text()).split())
                                 for e in item.query_selector_all(".advice-evidence li")]})
    return out


def expected_page_advice(advice: dict[str, Any]) -> list[dict[str, Any]]:
    def norm(s: str) -> str:
        return " ".join(s.split())

    return [{"code": r["code"], "title": norm(r["title"]),
             "stake": norm(advice_stake(Recommendation.model_validate(r))), "wording": norm(r["wording"]),
             "prediction": norm(r["prediction"]),
             "model": norm(f"model ({r['model']['name']}): {r['model']['statement']}"),
             "confidence": norm(f"confidence: {r['confidence']['text']}"),
             "evidence": [norm(f"{e['label']} {e['text']}") for e in r["evidence"]]}
            for r in advice["recommendations"]]


def cli_advise(server: Server, run_id: str) -> str:
    out = subprocess.run([*GOODPUT, "advise", run_id, "--url", server.url], env=_env(), check=False,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())  # the CLI wraps at spaces only: joined, its sentences are the API's


def test_run_page_cli_api_and_json_report_give_the_same_advice(seven_runs: Server, tab: Page) -> None:
    run_id = IDLE_GPUS  # failures, restarts and unused GPUs: several recommendations, each with evidence
    api = seven_runs.get(f"/v1/runs/{run_id}/advice")
    report = seven_runs.get(f"/v1/runs/{run_id}/report", format="json")
    cli = cli_advise(seven_runs, run_id)
    open_run(tab, seven_runs, run_id)
    shown = page_advice(tab)
    assert len(api["recommendations"]) >= 2
    # the JSON report embeds the engine's document unchanged
    assert report["recommendations"] == api["recommendations"]
    assert report["measured"] == api["measured"]
    assert report["advice_notes"] == api["notes"]
    # the page: the same recommendations, in the same order, every sentence and figure as served
    assert shown == expected_page_advice(api)
    assert inner(tab, "#run-advice-measured") == [" ".join(api["measured"]["text"].split())]
    assert inner(tab, ".advice-note") == [" ".join(n.split()) for n in api["notes"]]
    # the CLI prints the same sentences in the same order
    position = 0
    for rec in expected_page_advice(api):
        for piece in (rec["title"], rec["stake"], rec["wording"], rec["prediction"], *rec["evidence"],
                      rec["model"], rec["confidence"]):
            found = cli.find(piece, position)
            assert found >= 0, (piece, cli[position:position + 400])
            position = found + len(piece)
    # the page's total waste card and the engine's measured figures agree
    unit = fmt.gpu_time_unit(api["measured"]["allocated_gpu_seconds"])
    assert inner(tab, "#run-kpi-wasted") == [fmt.gpu_time(api["measured"]["waste_gpu_seconds"], unit)]
    assert tab.errors == []


def test_the_idle_gpu_run_is_told_about_its_unused_gpus(seven_runs: Server, tab: Page) -> None:
    open_run(tab, seven_runs, IDLE_GPUS)
    assert inner(tab, "#run-unused-gpus b") == ["8 of 32 allocated GPUs never ran a rank."]
    api = seven_runs.get(f"/v1/runs/{IDLE_GPUS}/advice")
    unused = [r for r in api["recommendations"] if r["code"] == "unused_gpus"]
    assert len(unused) == 1
    assert inner(tab, "#run-advice-unused_gpus .advice-wording") == [" ".join(unused[0]["wording"].split())]
    assert "8 of 32" in unused[0]["wording"]
    tab.page.wait_for_selector("#run-heatmap-graph .main-svg")
    tab.page.wait_for_timeout(300)
    tab.screenshot("run-idle-gpus")
    assert tab.errors == []


def test_a_healthy_run_gets_no_checkpoint_advice_from_other_runs_failures(seven_runs: Server, tab: Page) -> None:
    api = seven_runs.get(f"/v1/runs/{HEALTHY}/advice")
    assert api["measured"]["failures"] == 0
    assert not [r for r in api["recommendations"] if r["confidence"].get("failure_rate_source") == "project"]
    assert not [r for r in api["recommendations"] if r["code"] == "checkpoint_interval"]
    open_run(tab, seven_runs, HEALTHY)
    assert page_advice(tab) == expected_page_advice(api)
    assert not tab.page.query_selector("#run-advice-checkpoint_interval")
    if not api["recommendations"]:
        assert inner(tab, "#run-advice-none") == [no_advice(RunAdvice.model_validate(api).measured)]
    tab.page.wait_for_selector("#run-heatmap-graph .main-svg")
    tab.page.wait_for_timeout(300)
    tab.screenshot("run-healthy")
    assert tab.errors == []


@pytest.mark.parametrize("run_id", [*SEVEN_RUNS, SILENT])
def test_every_kind_of_run_shows_the_engines_advice_and_its_links(seven_runs: Server, tab: Page,
                                                                    run_id: str) -> None:
    open_run(tab, seven_runs, run_id)
    api = seven_runs.get(f"/v1/runs/{run_id}/advice")
    if run_id not in (SILENT, LIVE):  # a running run's figures move between the page's answer and this one
        assert page_advice(tab) == expected_page_advice(api)
    else:
        assert [r["code"] for r in page_advice(tab)] == [r["code"] for r in api["recommendations"]]
    for fmt_name in ("html", "csv", "json"):
        href = tab.page.get_attribute(f"#run-link-report-{fmt_name}", "href")
        assert href == f"/v1/runs/{quote(run_id, safe='')}/report?format={fmt_name}"
        assert httpx.get(f"{seven_runs.url}{href}", timeout=120).status_code == 200
    assert tab.page.get_attribute("#run-link-advice", "href") == f"/v1/runs/{quote(run_id, safe='')}/advice"
    tab.page.wait_for_selector("#run-heatmap-graph .main-svg")
    tab.page.wait_for_timeout(300)  # let plotly finish laying out before the screenshot
    tab.screenshot(f"run-advice-{run_id}")
    assert tab.errors == []


def test_a_rank_opens_as_a_drill_down_and_its_address_survives_a_reload(seven_runs: Server, tab: Page) -> None:
    open_run(tab, seven_runs, STRAGGLER)
    table = inner(tab, "#run-straggler-table-data tbody tr")
    assert table[0].startswith("5 node000"), table  # the straggler first, named with its host
    tab.page.click("#run-straggler-table-data tbody tr:first-child a")
    tab.page.wait_for_url(re.compile(r".*/runs/bert-straggler\?rank=5$"))
    detail = seven_runs.get(f"/v1/runs/{STRAGGLER}/ranks/5")
    ranks = seven_runs.get(f"/v1/runs/{STRAGGLER}/ranks")["ranks"]

    def check() -> None:
        tab.page.wait_for_selector("#run-rank-title", state="visible")
        assert inner(tab, "#run-rank-title")[0].startswith("Drill-down: rank 5 on node000")
        assert inner(tab, "#run-rank-host") == ["node000"]
        assert inner(tab, "#run-rank-steps") == [fmt.integer(detail["steps"]["steps_total"])]
        row = next(r for r in ranks["rows"] if r["rank"] == 5)
        assert inner(tab, "#run-rank-straggler") == [fmt.gpu_time(row["straggler_gpu_seconds"])]
        assert inner(tab, "#run-rank-straggler-note") == ["flagged straggler"]
        tab.page.wait_for_selector("#run-rank-timeline-graph .main-svg")
        tab.page.wait_for_selector("#run-rank-steps-graph .main-svg")

    check()
    assert detail["host"] == "node000" and detail["host_ranks"] == list(range(8))
    assert detail["steps"]["steps_total"] == row_steps(ranks, 5)
    tab.page.reload()
    check()
    tab.page.wait_for_timeout(300)
    tab.screenshot("run-rank-drill-down")
    tab.page.locator("#run-rank-panel").screenshot(path=str(SCREENSHOTS / "run-rank-panel.png"))
    # another rank on the same host, from the drill-down's own links
    tab.page.click("#run-rank-host-ranks a >> text='3'")
    tab.page.wait_for_url(re.compile(r".*\?rank=3$"))
    tab.page.wait_for_selector("#run-rank-title:has-text('rank 3 on node000')")
    assert inner(tab, "#run-rank-straggler-note") == ["not flagged"]
    assert tab.errors == []


def row_steps(ranks: dict[str, Any], rank: int) -> int:
    return int(next(r["steps"] for r in ranks["rows"] if r["rank"] == rank))


def test_a_failed_ranks_drill_down_lists_the_failures_it_was_part_of(seven_runs: Server, tab: Page) -> None:
    timeline = seven_runs.get(f"/v1/runs/{IDLE_GPUS}/timeline")["timeline"]
    open_run(tab, seven_runs, IDLE_GPUS, "?rank=23")
    tab.page.wait_for_selector("#run-rank-failures-table")
    rows = inner(tab, "#run-rank-failures-table tbody tr")
    assert len(rows) == len(timeline["failures"]) == 2
    for shown, failure in zip(rows, timeline["failures"], strict=True):
        assert shown.startswith(f"{failure['attempt']} {fmt.timestamp(failure['time'])}")
        assert shown.endswith("reported the failure")
    assert inner(tab, "#run-rank-host") == ["node002"]
    assert tab.errors == []


def test_many_attempts_keep_whole_labels_and_startup_failures_say_so(seven_runs: Server, tab: Page) -> None:
    restarts = seven_runs.get(f"/v1/runs/{RESTARTS}/restarts")["restarts"]
    open_run(tab, seven_runs, RESTARTS)
    tab.page.wait_for_selector("#run-timeline-graph .main-svg")
    labels = [str(t.text_content()).strip() for t in tab.page.query_selector_all("#run-timeline-graph g.barlayer text")]
    labels = [t for t in labels if t.startswith("#")]
    assert labels
    assert all(re.fullmatch(r"#\d+( (failed|completed|ended|running|preempted))?", t) for t in labels), labels
    body = text_of(tab, "#run-restart-table")
    assert "step —" not in body
    for r in restarts:
        if r["failed_at_step"] is None:
            assert f"{r['after']} during startup (no step completed)" in body
    tab.page.wait_for_timeout(300)
    tab.screenshot("run-restarts")
    assert tab.errors == []


def text_of(tab: Page, selector: str) -> str:
    return str(tab.page.inner_text(selector))


def test_the_step_axis_follows_a_time_zoom(seven_runs: Server, tab: Page) -> None:
    open_run(tab, seven_runs, HEALTHY)
    tab.page.wait_for_selector("#run-timeline-graph .main-svg")
    before = tab.page.evaluate("() => document.querySelector('#run-timeline-graph .js-plotly-plot')"
                               "._fullLayout.yaxis2.range.slice()")
    # zoom the time axis onto the first quarter of the run, as a drag does
    tab.page.evaluate("""() => {
        const gd = document.querySelector('#run-timeline-graph .js-plotly-plot');
        const ax = gd._fullLayout.xaxis2, lo = ax.r2c(ax.range[0]), hi = ax.r2c(ax.range[1]);
        return Plotly.relayout(gd, {'xaxis2.range': [ax.c2r(lo), ax.c2r(lo + (hi - lo) / 4)]});
    }""")
    tab.page.wait_for_function("(b) => { const r = document.querySelector('#run-timeline-graph .js-plotly-plot')"
                               "._fullLayout.yaxis2.range; return r[1] < b * 0.6; }", arg=before[1])
    after = tab.page.evaluate("() => document.querySelector('#run-timeline-graph .js-plotly-plot')"
                              "._fullLayout.yaxis2.range.slice()")
    assert after[1] < before[1] * 0.6
    tab.page.dblclick("#run-timeline-graph .nsewdrag >> nth=1")  # reset: the steps of the whole run again
    tab.page.wait_for_function("(b) => { const r = document.querySelector('#run-timeline-graph .js-plotly-plot')"
                               "._fullLayout.yaxis2.range; return r[1] >= b * 0.99; }", arg=before[1])
    assert tab.errors == []


def test_the_healthy_heat_map_is_pale_and_names_hosts(seven_runs: Server, tab: Page) -> None:
    open_run(tab, seven_runs, HEALTHY)
    tab.page.wait_for_selector("#run-heatmap-graph .main-svg")
    figure = tab.page.evaluate("() => document.querySelector('#run-heatmap-graph .js-plotly-plot').data[0]")
    assert figure["y"][0] == "0 · node000"
    excess = [v for row in figure["z"] for v in row if v is not None]
    assert max(excess) < 0.1  # within 10% of the median: the scale's palest tenth (0 to +50%)
    straggler = seven_runs.get(f"/v1/runs/{STRAGGLER}/ranks")["ranks"]["heatmap"]
    assert straggler["rank_labels"][5] == "5"
    assert json.dumps(figure["customdata"][0][0][1]) == '"node000"'


def settled_box(tab: Page, selector: str) -> dict[str, float]:
    """The bounding box of an element once it has stayed put for 300 ms: panels above a graph (the rank's
    drill-down, the advice, the training curves) grow as their answers arrive and move it down the page."""
    deadline = time.monotonic() + 30
    area = tab.page.locator(selector).first
    area.scroll_into_view_if_needed()
    last = area.bounding_box()
    while True:
        tab.page.wait_for_timeout(300)
        box = area.bounding_box()
        if box == last or time.monotonic() > deadline:
            assert box is not None
            return box
        area.scroll_into_view_if_needed()
        last = area.bounding_box()


def hover(tab: Page, graph: str, fx: float, fy: float) -> tuple[float, float]:
    """Hover the point at fractions (fx, fy) of a graph's plot area until plotly shows its label; the point's page
    coordinates. Plotly labels a point when the mouse moves over it: a graph drawn again under a still mouse (the
    page settling after a navigation, a refresh) shows nothing until the mouse moves, as for a user."""
    deadline = time.monotonic() + 30
    while True:
        box = settled_box(tab, f"{graph} .nsewdrag")
        x, y = box["x"] + box["width"] * fx, box["y"] + box["height"] * fy
        tab.page.mouse.move(x - 2, y)
        tab.page.mouse.move(x, y)
        try:
            tab.page.wait_for_selector(f"{graph} .hoverlayer .hovertext", timeout=3_000)
            return x, y
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise


def click_point(tab: Page, graph: str, fx: float, fy: float, opens: re.Pattern[str]) -> None:
    """Click the point at fractions (fx, fy) of a graph's plot area until the page's address matches `opens`.
    Plotly clicks the point it hovers; a graph drawn again between the hover and the click (the run's views
    arriving after a navigation) has no hovered point and the click does nothing, so the user clicks again."""
    deadline = time.monotonic() + 60
    while True:
        x, y = hover(tab, graph, fx, fy)
        tab.page.mouse.click(x, y)
        try:
            tab.page.wait_for_url(opens, timeout=5_000)
            return
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise


def test_a_click_on_a_heat_map_row_or_a_ranks_bar_opens_that_rank(seven_runs: Server, tab: Page) -> None:
    open_run(tab, seven_runs, STRAGGLER)
    tab.page.wait_for_selector("#run-heatmap-graph .main-svg")
    # a real click in the middle of rank 12's row (16 rows, rank 0 at the top)
    click_point(tab, "#run-heatmap-graph", 0.5, 12.5 / 16, re.compile(r".*/runs/bert-straggler\?rank=12$"))
    tab.page.wait_for_selector("#run-rank-title:has-text('rank 12 on node001')")
    tab.page.wait_for_selector("#run-advice-measured", state="visible", timeout=60_000)
    tab.page.wait_for_selector("#run-ranks-graph .main-svg")
    # a real click on rank 5's bar (16 bars on an axis from -0.5 to 15.5), low enough to be inside every bar
    click_point(tab, "#run-ranks-graph", 5.5 / 16, 0.9, re.compile(r".*\?rank=5$"))
    tab.page.wait_for_selector("#run-rank-title:has-text('rank 5 on node000')")
    assert tab.errors == []
