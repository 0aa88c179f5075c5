"""The fleet page's pure pieces over a time range (figures cut to it, buckets where time was spent, sort, pages,
projects, comparison) and the colours' meanings (statuses apart from categories, one legend entry per meaning, a
healthy heat map that looks healthy)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dashboards import data, figures
from dashboards.components import fleet_parts
from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from services.presentation import CATEGORIES, COLORS, MARKER_COLORS, STATUS_COLORS
from services.schemas.fleet import FleetWindow
from services.simulate import SimConfig, simulate
from tests.dashboards.answers import run_item

T = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def in_window(run_id: str, project: str, allocated: float, hang: float = 0.0, *, life: float | None = None,
              buckets: dict[str, list[float]] | None = None, status: str = "finished",
              restarts: int = 0) -> dict[str, Any]:
    waste = {**dict.fromkeys(CATEGORIES, 0.0), "hang": hang}
    productive = allocated - hang
    return {
        "run": run_item(run_id=run_id, project=project, status=status, first_time=T - 7200, last_time=T + 3600,
                        allocated_gpu_seconds=life or allocated * 3, productive_gpu_seconds=(life or allocated * 3) / 2,
                        goodput=0.5, waste_gpu_seconds=dict.fromkeys(CATEGORIES, (life or allocated * 3) / 12),
                        restarts=restarts).model_dump(mode="json"),
        "window": {"allocated_gpu_seconds": allocated, "productive_gpu_seconds": productive,
                   "waste_gpu_seconds": waste, "goodput": productive / allocated if allocated else None},
        "buckets": buckets or {"productive": [productive / 2] * 2, **({"hang": [hang, 0.0]} if hang else {})},
        "laid_out": True,
    }


def fleet(*runs: dict[str, Any]) -> FleetWindow:
    return FleetWindow.model_validate({"since": T, "until": T + 3600, "bucket_start": T, "bucket_s": 1800.0,
                                       "bucket_count": 2, "server_time": T + 3600, "runs": list(runs)})


def test_the_table_and_cards_show_the_figures_inside_the_range_not_the_runs_whole_life() -> None:
    window = fleet(in_window("a", "vision", 8 * 3600.0, hang=3600.0, life=80 * 3600.0))
    frame = data.window_frame(window)
    row = frame.iloc[0]
    assert row["allocated_gpu_seconds"] == 8 * 3600.0 and row["life_allocated_gpu_seconds"] == 80 * 3600.0
    cards = {c.children[1].id: c.children[1].children for c in fleet_parts.kpis(data.fleet_totals(frame), frame)}
    assert cards["fleet-kpi-allocated"] == "8.00 GPU-h" and cards["fleet-kpi-waste-hang"] == "1.00 GPU-h"
    assert "each run counts only its GPU time inside this range" in fleet_parts.range_note(window, frame)


def test_over_time_keeps_each_runs_time_in_its_own_bucket_and_project() -> None:
    window = fleet(in_window("a", "vision", 7200.0, hang=3600.0, buckets={"productive": [0.0, 3600.0],
                                                                          "hang": [3600.0, 0.0]}),
                   in_window("b", "text", 3600.0, buckets={"productive": [1800.0, 1800.0]}))
    buckets = data.over_time(window)
    hang = buckets[buckets["category"] == "hang"]
    assert hang.set_index("bucket_start")["gpu_seconds"].to_dict() == {T: 3600.0, T + 1800: 0.0}
    only_b = data.over_time(window, keep={("text", "b")})
    assert set(only_b["project"]) == {"text"} and only_b["gpu_seconds"].sum() == 3600.0
    trend = figures.goodput_trend_figure(buckets, "30 min")
    by_project = {t.name: list(t.y) for t in trend.data}
    assert by_project == {"text": [1.0, 1.0], "vision": [0.0, 1.0]}
    over = figures.fleet_over_time_figure(buckets, "30 min")
    assert over.layout.yaxis.title.text == "GPU-hours"
    assert [t.name for t in over.data] == ["Productive", "Hang"]


def test_runs_sort_by_any_column_and_come_a_page_at_a_time() -> None:
    runs = [in_window(f"run-{i:03d}", "p" if i % 2 else "q", 100.0 * (i + 1), restarts=i % 7) for i in range(230)]
    frame = data.window_frame(fleet(*runs))
    assert list(frame["run_id"][:2]) == ["run-000", "run-001"]  # nothing wasted: ties in run id order
    by_alloc = data.sort_runs(frame, "allocated", descending=False)
    assert list(by_alloc["run_id"][:3]) == ["run-000", "run-001", "run-002"]
    by_name = data.sort_runs(frame, "run", descending=True)
    assert by_name["run_id"].iloc[0] == "run-229"
    grouped = data.sort_runs(frame, "allocated", descending=True, group_by_project=True)
    assert list(grouped["project"][:115]) == ["p"] * 115 and grouped["run_id"].iloc[0] == "run-229"
    page, number, pages = data.page_of(by_alloc, 10, 25)
    assert (number, pages, len(page)) == (10, 10, 5)  # 230 runs: nothing stops at 200
    assert list(page["run_id"]) == [f"run-{i:03d}" for i in range(225, 230)]
    assert data.page_of(by_alloc, 99, 25)[1] == 10 and data.page_of(by_alloc, 0, 25)[1] == 1
    head = fleet_parts.runs_head(sort_key="allocated", descending=False)
    headers = [th.children for th in head.children.children]
    sorted_header = next(h for h in headers if getattr(h, "className", "") == "sort-button sorted")
    assert sorted_header.children == "Allocated ▲" and sorted_header.id["column"] == "allocated"


def test_projects_add_up_their_runs_and_runs_compare_side_by_side() -> None:
    frame = data.window_frame(fleet(in_window("a", "vision", 7200.0, hang=3600.0), in_window("b", "vision", 3600.0),
                                    in_window("c", "text", 1800.0)))
    projects = data.projects_frame(frame).set_index("project")
    assert projects.loc["vision", "runs"] == 2 and projects.loc["vision", "allocated_gpu_seconds"] == 10800.0
    assert projects.loc["vision", "goodput"] == pytest.approx(7200.0 / 10800.0)
    compared = fleet_parts.comparison(frame, ["vision/a", "text/c"])
    table = compared.children[0].children
    assert [th.children.children for th in table.children[0].children.children[1:]] == ["a", "c"]
    figure = compared.children[1].figure
    assert list(figure.data[0].y) == ["c", "a"] and figure.data[0].x[1] == pytest.approx(0.5)
    assert fleet_parts.comparison(frame, ["vision/a"]).children == "Choose at least two runs."


def test_custom_and_preset_ranges_read_as_utc() -> None:
    assert data.time_range("1h", None, None, now=T) == (T - 3600, None)
    assert data.time_range("all", None, None, now=T) == (None, None)
    assert data.time_range("custom", "2026-01-01 00:00", "2026-01-01T06:30", now=0.0) == (T, T + 6.5 * 3600)
    assert data.time_range("custom", "", "2026-01-01T00:00", now=0.0) == (None, T)


def test_statuses_and_markers_never_wear_a_waste_categorys_colour() -> None:
    category_colours = {c.upper() for c in COLORS.values()}
    assert not category_colours & {c.upper() for c in STATUS_COLORS.values()}
    assert not category_colours & {c.upper() for c in MARKER_COLORS.values()}
    assert len({STATUS_COLORS[s] for s in ("running", "finished", "failed", "hung", "preempted")}) == 5
    assert STATUS_COLORS["running"] != COLORS["checkpoint"] and MARKER_COLORS["failure"] == STATUS_COLORS["failed"]


@pytest.fixture(scope="module")
def failing_views() -> Any:
    result = simulate(SimConfig(run_id="f", ranks=8, hours=0.3, mtbf_s=400.0, seed=3, straggler_rank=2))
    data_ = run_data_from_events("f", result.events)
    ledger = build_ledger(data_)
    return build_run_views(data_, ledger, version=1), ledger


def test_the_timeline_legend_has_one_entry_per_meaning(failing_views: Any) -> None:
    views, _ = failing_views
    fig = figures.timeline_figure(views)
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert len(shown) == len(set(shown)), shown
    assert shown.count("Checkpoint") == 1
    attempts = next(t for t in fig.data if t.name == "Attempts")
    assert set(attempts.marker.color) <= set(STATUS_COLORS.values())
    assert COLORS["hang"] not in set(attempts.marker.color) and COLORS["checkpoint"] not in set(attempts.marker.color)
    failures = [t for t in fig.data if t.name == "Failure"]
    assert failures and failures[0].marker.color == MARKER_COLORS["failure"]


def test_a_healthy_runs_heat_map_is_pale_and_a_stragglers_row_is_dark() -> None:
    def heat(**straggler: Any) -> tuple[np.ndarray, float, Any]:
        result = simulate(SimConfig(run_id="h", ranks=8, hours=0.1, mtbf_s=None, jitter=0.02, seed=1, **straggler))
        data_ = run_data_from_events("h", result.events)
        views = build_run_views(data_, build_ledger(data_), version=1)
        fig = figures.heatmap_figure(views.ranks)
        trace = fig.data[0]
        z = np.array([[np.nan if v is None else v for v in row] for row in trace.z], dtype=float)
        return z, float(trace.zmax), views.ranks

    healthy, zmax, _ = heat()
    assert np.nanmax(np.abs(healthy)) < 0.2 * zmax  # the pale end of the scale everywhere
    slow, zmax, ranks = heat(straggler_rank=5, straggler_factor=1.5)
    row = ranks.heatmap.rank_labels.index("5")
    assert np.nanmedian(slow[row]) >= 0.8 * zmax and np.nanmax(np.delete(slow, row, axis=0)) < 0.2 * zmax


def test_fleet_goodput_is_the_ratio_of_the_sums_and_none_where_nothing_was_allocated() -> None:
    from services.schemas.ledger import goodput_ratio

    frame = data.window_frame(fleet(in_window("a", "vision", 7200.0, hang=3600.0), in_window("b", "text", 1800.0),
                                    in_window("c", "empty", 0.0)))
    # (3600 + 1800) / (7200 + 1800): not the mean of the runs' 0.5 and 1.0
    assert data.fleet_totals(frame)["goodput"] == pytest.approx(5400.0 / 9000.0)
    goodput = data.projects_frame(frame).set_index("project")["goodput"].to_dict()
    assert goodput["text"] == 1.0 and np.isnan(goodput["empty"])
    assert goodput_ratio(0.0, 0.0) is None and goodput_ratio(1.0, 4.0) == 0.25
