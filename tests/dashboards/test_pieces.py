"""Formatting, data shaping and figure builders of the dashboard (pure: no server, no browser)."""

from __future__ import annotations

import pytest

from dashboards import data, figures
from dashboards.components import fleet_parts, run_parts
from services import presentation as fmt
from services.presentation import CATEGORIES
from services.schemas.runs import RunListItem
from services.schemas.views import NoRankCompute
from tests.dashboards.answers import ledger, live_run, run_item, run_view


def run_row(run_id: str, waste: float, status: str = "finished", first: float = 0.0, last: float = 3600.0,
            stale: bool = False) -> RunListItem:
    per = dict.fromkeys(CATEGORIES, waste / len(CATEGORIES))
    return run_item(run_id=run_id, status=status, first_time=first, last_time=last,
                    allocated_gpu_seconds=7200.0 + waste, productive_gpu_seconds=7200.0,
                    goodput=7200.0 / (7200.0 + waste), waste_gpu_seconds=per, restarts=0, stale=stale)


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0.0 GPU-s"), (40.0, "40.0 GPU-s"), (600.0, "10.0 GPU-min"), (2 * 300.0, "10.0 GPU-min"),
    (3599.0, "60.0 GPU-min"), (3600.0, "1.00 GPU-h"), (12_345_678.0, "3,429.36 GPU-h"), (None, "—"),
])
def test_gpu_time_takes_the_unit_its_size_calls_for(seconds: float | None, text: str) -> None:
    assert fmt.gpu_time(seconds) == text


def test_a_small_run_reads_in_minutes_and_a_set_of_figures_shares_one_unit() -> None:
    # a 2-GPU run of five minutes: 600 GPU-s allocated, 18 of them idle
    unit = fmt.gpu_time_unit(600.0, 18.0, 0.0)
    assert unit is fmt.GPU_MINUTES and unit.title == "GPU-minutes"
    assert [fmt.gpu_time(v, unit) for v in (600.0, 18.0, 0.0, 1.0, 90.0)] == [
        "10.0 GPU-min", "18.0 GPU-s", "0.0 GPU-min", "1.0 GPU-s", "1.5 GPU-min"]
    assert fmt.gpu_time(7200.0, fmt.gpu_time_unit(7200.0, 30.0), with_unit=False) == "2.00"
    assert fmt.gpu_time_unit() is fmt.GPU_SECONDS and fmt.gpu_time_unit(None, float("nan")) is fmt.GPU_SECONDS


@pytest.mark.parametrize(("seconds", "unit", "text"), [
    (3.0, fmt.GPU_HOURS, "3.0 GPU-s"), (36.0, fmt.GPU_HOURS, "36.0 GPU-s"), (300.0, fmt.GPU_HOURS, "5.0 GPU-min"),
    (360.0, fmt.GPU_HOURS, "0.10 GPU-h"), (0.0, fmt.GPU_HOURS, "0.00 GPU-h"), (30.0, fmt.GPU_MINUTES, "30.0 GPU-s"),
])
def test_a_figure_too_small_for_the_shared_unit_is_written_in_its_own(seconds: float, unit: fmt.GpuTimeUnit,
                                                                     text: str) -> None:
    # a first small job beside big ones: never "0.01 GPU-h" nor "<0.01"
    assert fmt.gpu_time(seconds, unit) == text
    assert fmt.gpu_time(seconds, unit, with_unit=False) == (text if text.split()[1] != unit.symbol
                                                           else text.split()[0])


def test_a_small_runs_cards_and_bars_use_minutes_not_slivers_of_hours() -> None:
    small = run_item(run_id="tiny", allocated_gpu_seconds=600.0, productive_gpu_seconds=540.0, goodput=0.9,
                     waste_gpu_seconds={**dict.fromkeys(CATEGORIES, 0.0), "startup": 60.0}, first_time=0.0,
                     last_time=300.0)
    frame = data.runs_frame([small])
    cards = {c.children[1].id: c.children[1].children for c in fleet_parts.kpis(data.fleet_totals(frame), frame)}
    assert cards["fleet-kpi-allocated"] == "10.0 GPU-min" and cards["fleet-kpi-waste-startup"] == "1.0 GPU-min"
    assert not any("<0.01" in str(v) for v in cards.values())
    fig = figures.fleet_runs_figure(frame)
    assert fig.layout.xaxis.title.text == "GPU-minutes" and fig.data[0].x[0] == pytest.approx(9.0)
    assert "9.0 GPU-min" in fig.data[0].customdata[0][1]


def test_durations_and_percentages_read_naturally() -> None:
    assert fmt.percent(0.57692) == "57.7%"
    assert fmt.percent(None) == "—"
    assert fmt.duration(5.25) == "5.2 s"
    assert [fmt.duration(v) for v in (0.073, 0.048, 0.0042, 0.0, 9.96, 45.0)] == [
        "73 ms", "48 ms", "4.2 ms", "0 s", "10 s", "45 s"]
    assert fmt.duration(725) == "12 min 05 s"
    assert fmt.duration(3 * 3600 + 20 * 60) == "3 h 20 min"


def test_runs_are_sorted_worst_first_and_totals_add_up() -> None:
    frame = data.runs_frame([run_row("a", 100.0), run_row("b", 900.0), run_row("c", 500.0)])
    assert list(frame["run_id"]) == ["b", "c", "a"]
    totals = data.fleet_totals(frame)
    assert totals["allocated"] == pytest.approx(3 * 7200.0 + 1500.0)
    assert totals["goodput"] == pytest.approx(3 * 7200.0 / (3 * 7200.0 + 1500.0))


def test_empty_fleet_and_empty_run_draw_explanations_not_blank_axes() -> None:
    empty = data.runs_frame([])
    assert figures.fleet_runs_figure(empty).layout.annotations[0].text == "No runs match the filters"
    no_steps = NoRankCompute(rows=[], heatmap=None, compute_source=None, straggler_ranks=[])
    assert figures.rank_compute_figure(no_steps).layout.annotations[0].text == "No step timings reported yet"
    assert "Nothing allocated" in figures.ledger_figure(ledger()).layout.annotations[0].text


def test_ledger_waterfall_steps_down_from_allocated_to_productive() -> None:
    waste = {"startup": 360.0, "checkpoint": 0.0, "rework": 720.0, "hang": 0.0, "straggler": 0.0, "idle": 0.0}
    fig = figures.ledger_figure(ledger(allocated_gpu_seconds=4860.0, productive_gpu_seconds=3600.0,
                                       eval_gpu_seconds=180.0, waste_gpu_seconds=waste))
    bar = fig.data[0]
    assert list(bar.x) == ["Allocated", "Startup", "Checkpoint", "Rework", "Hang", "Straggler", "Idle", "Eval",
                           "Productive"]
    assert bar.y[0] == pytest.approx(1.35) and bar.y[-1] == pytest.approx(1.0)
    assert bar.base[1] == pytest.approx(1.25) and bar.base[3] == pytest.approx(1.05)  # each step hangs off the last
    assert bar.y[7] == pytest.approx(0.05) and bar.base[7] == pytest.approx(1.0)  # eval: neither waste nor productive
    assert fig.layout.yaxis.title.text == "GPU-hours"


def test_fleet_table_row_shows_status_goodput_and_a_bar_per_category() -> None:
    frame = data.runs_frame([run_row("r/1", 720.0, status="running")],
                            live=[live_run(run_id="r/1", seconds_since_progress=4000.0, possibly_hung=True,
                                           at_risk_gpu_seconds=10.0)])
    row = fleet_parts.runs_rows(frame)[0]
    assert row.to_plotly_json()["props"]["data-run-id"] == "r/1"
    cells = row.children
    assert cells[0].children.href.endswith("/runs/r%2F1?project=default")  # a run is (project, run id)
    assert cells[1].children == "default"
    assert cells[3].children == fmt.percent(7200.0 / 7920.0)
    assert cells[4].children == "2.20 GPU-h"
    assert len(cells[5].children.children) == 1 + len(CATEGORIES)
    assert "possibly hung" in cells[8].children.children


def test_run_kpis_use_the_ledgers_numbers() -> None:
    waste = dict.fromkeys(CATEGORIES, 360.0)
    run = ledger(allocated_gpu_seconds=9360.0, productive_gpu_seconds=7200.0, goodput=7200.0 / 9360.0,
                 waste_gpu_seconds=waste, allocated_wall_seconds=1170.0)
    cards = {c.children[1].id: c.children[1].children for c in run_parts.kpis(run)}
    assert cards["run-kpi-goodput"] == "76.9%"
    assert cards["run-kpi-allocated"] == "2.60 GPU-h"
    assert cards["run-kpi-waste-hang"] == "0.10 GPU-h"


def test_a_stale_build_says_when_it_is_from_and_that_it_is_being_redrawn() -> None:
    from tests.dashboards.test_resume_banner import flat_text

    assert run_parts.freshness_note(run_view(stale=False, analysed_at=0.0)) is None
    note = run_parts.freshness_note(run_view(stale=True, analysed_at=1_767_225_600.0, analysis_seconds=21.4))
    assert note is not None and note.to_plotly_json()["props"]["id"] == "run-freshness-note"
    text = flat_text(note)
    assert "as of 2026-01-01 00:00:00 UTC" in text and "about 21 s" in text and "redrawn" in text


def test_a_stale_fleet_row_says_it_is_updating() -> None:
    from tests.dashboards.test_resume_banner import flat_text

    fresh, stale = run_row("fresh", 100.0), run_row("busy", 50.0, status="running", stale=True)
    frame = data.runs_frame([fresh, stale])
    assert frame.set_index("run_id")["stale"].to_dict() == {"fresh": False, "busy": True}
    rows = {r.children[0].children.children: flat_text(r.children[2]) for r in
            fleet_parts.runs_rows(frame)}
    assert "updating" in rows["busy"] and "updating" not in rows["fresh"]
