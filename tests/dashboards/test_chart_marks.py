"""Charts that would mislead: a rank's step line breaks at each restart instead of running backwards, restart labels
never overlap (the ones that do not fit keep their line and hover mark), and an empty waste bar carries no "0". A run
that failed for good says why its last attempt failed."""

from __future__ import annotations

import itertools

from dashboards import figures
from dashboards.components.run_parts import final_failure_note
from dashboards.figures.common import label_rows
from dashboards.figures.rank import rank_timeline_figure
from services.presentation import CATEGORIES
from services.schemas.views import Restart
from services.simulate import SimConfig
from tests.analysis.test_failure_causes import killed_rank_3, launcher_saw, two_attempts
from tests.analysis.test_failure_causes import views_of as views_of_events
from tests.dashboards.answers import ledger
from tests.dashboards.test_run_page_parts import flat_text, rank_of


def test_a_ranks_step_line_breaks_at_each_restart_and_never_runs_backwards() -> None:
    detail, _, _ = rank_of(SimConfig(run_id="f", ranks=4, hours=0.2, mtbf_s=400.0, seed=3, max_failures=3), 2)
    attempts = sorted(set(detail.steps.attempt))
    assert len(attempts) >= 2, "the simulated run must restart"
    (line,) = [t for t in rank_timeline_figure(detail).data if t.name == "Step reached"]
    pieces: list[list[int]] = [[]]
    for step in line.y:
        if step is None:
            pieces.append([])
        else:
            pieces[-1].append(step)
    assert len(pieces) == len(attempts)  # one piece per attempt
    assert [len(p) for p in pieces] == [detail.steps.attempt.count(a) for a in attempts]
    assert all(b >= a for piece in pieces for a, b in itertools.pairwise(piece))


def test_restart_labels_are_staggered_so_none_overlaps_and_every_restart_keeps_a_hover_mark() -> None:
    views = views_of_events(two_attempts(killed_rank_3()))
    start, end = views.timeline.allocations[0].start, views.timeline.allocations[-1].end
    span = end - start
    times = [start + span * f for f in (0.30, 0.31, 0.33, 0.36, 0.40, 0.80)]  # five close together
    restarts = [Restart(attempt=i + 1, time=t, resume_step=10 * i) for i, t in enumerate(times)]
    crowded = views.model_copy(update={"timeline": views.timeline.model_copy(update={"restarts": restarts})})
    fig = figures.timeline_figure(crowded)
    (marks,) = [t for t in fig.data if t.name == "Restart"]
    assert len(marks.x) == len(restarts)
    labels = [a for a in fig.layout.annotations if a.name == "restart-label"]
    rows = label_rows(times, span)
    assert len(labels) == sum(r is not None for r in rows) < len(restarts)  # no room for some: hover only
    by_row: dict[float, list[float]] = {}
    for t, row in zip(times, rows, strict=True):
        if row is not None:
            by_row.setdefault(row, []).append(t)
    assert len(by_row) > 1  # staggered
    for placed in by_row.values():
        assert all(b - a >= 0.16 * span for a, b in itertools.pairwise(placed))


def test_a_waste_category_with_nothing_in_it_has_no_zero_label() -> None:
    waste = dict.fromkeys(CATEGORIES, 0.0) | {"startup": 360.0, "rework": 720.0}
    fig = figures.ledger_figure(ledger(allocated_gpu_seconds=7200.0, productive_gpu_seconds=6120.0,
                                       waste_gpu_seconds=waste, goodput=0.85))
    (bars,) = fig.data
    texts = dict(zip(bars.x, bars.text, strict=True))
    assert texts["Straggler"] == "" and texts["Hang"] == ""
    assert texts["Startup"] == "0.10 GPU-h<br>5.0%"  # 360 GPU-s of 7,200: value, unit and share
    assert "0" not in texts.values()


def test_a_run_that_failed_for_good_says_why_its_last_attempt_failed() -> None:
    restarted = views_of_events(two_attempts([*killed_rank_3(), launcher_saw(3, -9, 26.2)]))
    assert final_failure_note(restarted) is None  # its failure is the restarts table's
    (failure,) = restarted.timeline.failures
    failed_for_good = restarted.model_copy(update={"timeline": restarted.timeline.model_copy(
        update={"restarts": []})})
    text = flat_text(final_failure_note(failed_for_good))
    assert text.startswith(f"Attempt 0 failed at step {failure.step}, and no restart followed: ")
    assert "rank 3 on h1 killed by SIGKILL (exit code -9)" in text
