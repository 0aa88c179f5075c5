"""The run page's new pieces, pure: the recommendations panel shows the engine's text as served, a rank's drill-down
reads its own rows (checked against the simulator's truth), hosts are named where ranks are, a restart before any
step says so, unused GPUs are said, many attempts keep whole labels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dashboards import figures
from dashboards.components import run_parts
from dashboards.components.advice_panel import advice_panel
from dashboards.components.rank_panel import rank_panel
from dashboards.figures.rank import rank_steps_figure, rank_timeline_figure
from dashboards.figures.run import rank_of_heat_label
from services.analysis.advice import AdviceInput
from services.analysis.collective_time import comm_frame
from services.analysis.ledger import build_ledger
from services.analysis.rank_detail import build_rank_detail
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from services.presentation import advice_stake, no_advice
from services.reports.advice import run_advice
from services.schemas.advice import RunAdvice
from services.schemas.ranks import RankDetail
from services.schemas.views import RestartRow, RunViews
from services.simulate import SimConfig, simulate
from tests.dashboards.answers import live_run
from tests.dashboards.test_resume_banner import flat_text as component_text


def flat_text(component: Any) -> str:
    """The text of a component or of a list of them."""
    if isinstance(component, list):
        return "".join(flat_text(c) for c in component)
    return component_text(component)


def views_of(config: SimConfig) -> tuple[RunViews, Any, list[dict[str, Any]]]:
    result = simulate(config)
    data = run_data_from_events(config.run_id, result.events)
    ledger = build_ledger(data)
    return build_run_views(data, ledger, version=1), data, result.events


def rank_of(config: SimConfig, rank: int, **kwargs: Any) -> tuple[RankDetail, Any, list[dict[str, Any]]]:
    views, data, events = views_of(config)
    steps = data.steps[data.steps["rank"] == rank][["attempt", "step", "start", "end", "comm"]]
    ev = data.events[(data.events["rank"] == rank) & data.events["kind"].isin(["attempt_start", "attempt_end"])]
    return build_rank_detail(views, rank, steps, comm_frame(), ev, **kwargs), data, events


@pytest.fixture(scope="module")
def failing() -> tuple[RankDetail, Any, list[dict[str, Any]]]:
    return rank_of(SimConfig(run_id="f", ranks=16, hours=0.2, mtbf_s=500.0, seed=3, straggler_rank=9,
                             end="failed", max_failures=2), 9)


def test_a_ranks_drill_down_counts_its_own_steps_and_names_its_host(failing: Any) -> None:
    detail, data, events = failing
    mine = data.steps[data.steps["rank"] == 9]
    assert detail.known and detail.rank == 9
    assert detail.steps.steps_total == len(mine)
    assert detail.host == "node001"  # the simulator puts 8 ranks on a host
    assert detail.host_ranks == list(range(8, 16))
    assert detail.row is not None and detail.row.is_straggler
    starts = [e for e in events if e["kind"] == "attempt_start" and e["rank"] == 9]
    assert [a.attempt for a in detail.attempts] == [e["attempt"] for e in starts]
    assert sum(a.steps for a in detail.attempts) == len(mine)


def test_compute_and_collectives_add_up_to_each_steps_duration(failing: Any) -> None:
    detail, data, _ = failing
    mine = data.steps[data.steps["rank"] == 9].sort_values(["attempt", "step"])
    duration = (mine["end"] - mine["start"]).to_numpy()
    total = np.array(detail.steps.compute_s) + np.array([c or 0.0 for c in detail.steps.collective_s])
    assert total == pytest.approx(duration, rel=1e-9)
    assert detail.compute_source == "step duration minus collectives"


def test_a_rank_was_part_of_every_failure_of_its_attempts_and_reported_them(failing: Any) -> None:
    detail, _, events = failing
    failed = sorted({e["attempt"] for e in events if e["kind"] == "attempt_end" and e.get("reason") == "failed"})
    assert [f.attempt for f in detail.failures] == failed == [0, 1]
    assert all(f.reported_failure for f in detail.failures)


def test_many_steps_are_shown_as_means_of_equal_buckets(failing: Any) -> None:
    detail, data, _ = failing
    views, _, _ = views_of(SimConfig(run_id="f", ranks=16, hours=0.2, mtbf_s=500.0, seed=3, straggler_rank=9,
                                     end="failed", max_failures=2))
    mine = data.steps[data.steps["rank"] == 9][["attempt", "step", "start", "end", "comm"]]
    ev = data.events[data.events["rank"] == 9]
    small = build_rank_detail(views, 9, mine, comm_frame(), ev, max_points=50)
    per = small.steps.steps_per_point
    assert len(small.steps.step) <= 50 and per == -(-len(mine) // 50)
    assert small.steps.compute_s[0] == pytest.approx(float(np.mean(detail.steps.compute_s[:per])))
    assert small.steps.step[0] == detail.steps.step[per - 1]


def test_an_unknown_rank_says_it_has_no_rows(failing: Any) -> None:
    views, data, _ = views_of(SimConfig(run_id="u", ranks=4, hours=0.02, mtbf_s=None, seed=1))
    empty = data.steps.iloc[:0][["attempt", "step", "start", "end", "comm"]]
    detail = build_rank_detail(views, 99, empty, comm_frame(), data.events.iloc[:0])
    assert not detail.known
    assert "no step and no attempt event of rank 99" in flat_text(rank_panel(detail, None))


def test_the_drill_down_draws_its_timeline_steps_and_failures(failing: Any) -> None:
    detail, _, _ = failing
    text = flat_text(rank_panel(detail, "team"))
    assert "Drill-down: rank 9 on node001" in text and "reported the failure" in text
    timeline = rank_timeline_figure(detail)
    assert [t.name for t in timeline.data] == ["Attempts", "Step reached", "Failure"]
    steps = rank_steps_figure(detail)
    assert [t.name.split(" (")[0] for t in steps.data] == ["compute", "collectives"]


def test_the_panel_shows_the_engines_text_as_served() -> None:
    views, data, _ = views_of(SimConfig(run_id="a", ranks=8, gpus=12, hours=0.2, mtbf_s=500.0, seed=4))
    ledger = build_ledger(data)
    advice: RunAdvice = run_advice(AdviceInput(ledger=ledger, views=views, resume_check=None, peers=()))
    assert advice.recommendations
    text = flat_text(advice_panel(advice))
    assert advice.measured.text in text
    for rec in advice.recommendations:
        for piece in (rec.title, rec.wording, rec.prediction, advice_stake(rec), rec.confidence.text,
                      rec.model.statement, *(e.text for e in rec.evidence)):
            assert piece in text
    empty = advice.model_copy(update={"recommendations": [], "notes": ["a note"]})
    assert no_advice(advice.measured) in flat_text(advice_panel(empty)) and "a note" in flat_text(advice_panel(empty))


def test_a_failure_before_any_step_says_it_was_during_startup() -> None:
    row = RestartRow(attempt=1, time=0.0, after="failed", failed_at_step=None, resume_step=None, steps_reworked=0,
                     rework_gpu_seconds=0.0, hang_gpu_seconds=0.0, startup_gpu_seconds=120.0)
    table = run_parts.restart_table([row, row.model_copy(update={"failed_at_step": 1234})])
    outcomes = [r["outcome"] for r in table.data]
    assert outcomes == ["failed during startup (no step completed)", "failed at step 1,234"]


def test_a_resume_step_is_written_as_the_failure_step_is() -> None:
    row = RestartRow(attempt=1, time=0.0, after="failed", failed_at_step=3023, resume_step=3000, steps_reworked=1023,
                     rework_gpu_seconds=0.0, hang_gpu_seconds=0.0, startup_gpu_seconds=120.0)
    (shown,) = run_parts.restart_table([row]).data
    assert (shown["outcome"], shown["resume"], shown["reworked"]) == ("failed at step 3,023", "3,000", "1,023")


def test_a_checkpoint_note_never_says_every_dash() -> None:
    from services.schemas.ledger import CheckpointSummary
    from services.schemas.views import CheckpointRow
    from tests.reports import ledgers

    one = CheckpointSummary(count=1, ok=1, failed=0, torn=0, median_blocking_seconds=2.0,
                            median_interval_seconds=None, median_interval_steps=None, last_ok_step=100)
    row = CheckpointRow.model_validate({"attempt": 0, "step": 100, "start": 0.0, "end": 2.0, "blocking_seconds": 2.0,
                                        "ok": True, "torn": False})
    note = flat_text(run_parts.checkpoint_table([row], 1, ledgers.ledger(checkpoints=one)))
    assert "every" not in note and "median blocking 2.0 s. Newest first." in note
    every = one.model_copy(update={"count": 2, "median_interval_seconds": 600.0})
    assert "every 10 min 00 s." in flat_text(run_parts.checkpoint_table([row], 1, ledgers.ledger(checkpoints=every)))


def test_unused_gpus_are_said_and_a_full_allocation_says_nothing() -> None:
    idle, _, _ = views_of(SimConfig(run_id="i", ranks=24, gpus=32, hours=0.05, mtbf_s=None, seed=2))
    note = flat_text(run_parts.unused_gpus_note(idle))
    assert note.startswith("8 of 32 allocated GPUs never ran a rank.")
    full, _, _ = views_of(SimConfig(run_id="full", ranks=8, hours=0.05, mtbf_s=None, seed=2))
    assert run_parts.unused_gpus_note(full) is None


def test_hosts_are_named_on_the_heat_map_and_in_the_straggler_table() -> None:
    views, _, _ = views_of(SimConfig(run_id="s", ranks=16, hours=0.1, mtbf_s=None, seed=1, straggler_rank=5))
    heat = figures.heatmap_figure(views.ranks).data[0]
    assert heat.y[5] == "5 · node000" and heat.y[12] == "12 · node001"
    assert heat.customdata[5][0][1] == "node000"
    assert [rank_of_heat_label(label) for label in (heat.y[5], "0-7 · node000", "12", None)] == [5, None, 12, None]
    table = flat_text(run_parts.straggler_table(views.ranks, "s", None))
    assert table.startswith("RankHost") and "5node000" in table and "flagged straggler" in table
    options = run_parts.rank_options(views.ranks)
    assert options[5] == {"label": "rank 5 on node000 (straggler)", "value": 5}


def test_many_attempts_are_labelled_by_number_and_never_cut() -> None:
    views, _, _ = views_of(SimConfig(run_id="m", ranks=4, hours=0.3, mtbf_s=60.0, seed=5, max_failures=18,
                                     end="failed"))
    assert len(views.timeline.attempts) == 18
    fig = figures.timeline_figure(views)
    attempts = next(t for t in fig.data if t.name == "Attempts")
    assert list(attempts.text) == [f"#{a.attempt}" for a in views.timeline.attempts]
    assert fig.layout.uniformtext.mode == "hide"


def test_a_hung_runs_suspects_are_named_with_their_hosts() -> None:
    live = live_run(hung=True, suspects=[{"rank": 1, "host": "node007", "reasons": ["no heartbeat for 41 s"]}])
    assert run_parts.suspects_text(live) == "Suspect rank 1 on node007 (no heartbeat for 41 s)."
    unknown = live_run(hung=True, suspects=[{"rank": 1, "reasons": ["no heartbeat for 41 s"]}])
    assert run_parts.suspects_text(unknown) == "Suspect rank 1 (no heartbeat for 41 s)."


def test_a_hosts_clock_offset_is_on_the_drill_down_the_rank_table_and_the_ranks_note() -> None:
    """Issue 30, point 5: host node001's clock 60 s ahead, measured from its ranks' step ends."""
    config = SimConfig(run_id="c", ranks=16, hours=0.05, mtbf_s=None, seed=1, clock_offsets={"node001": 60.0})
    detail, data, events = rank_of(config, 9)
    assert detail.clock_offset_seconds == pytest.approx(60.0, abs=1e-3)
    true_end = next(e for e in events if e["kind"] == "steps" and e["rank"] == 9)["end"][0] - 60.0
    assert detail.steps.end[0] == pytest.approx(true_end, abs=1e-3)  # its times on the run's reference clock
    text = flat_text(rank_panel(detail, None))
    assert "Host clock1 min 00 s ahead" in text and "of the run's reference clock" in text
    views, _, _ = views_of(config)
    table = flat_text(run_parts.straggler_table(views.ranks, "c", None, shown=16))
    assert "9node0011 min 00 s ahead" in table and "1node000in step" in table
    note = run_parts.ranks_note(views.ranks, build_ledger(data))
    assert "node001 1 min 00 s ahead" in note and "NTP" in note
