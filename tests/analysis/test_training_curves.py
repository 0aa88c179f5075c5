"""Training curves: loss, learning rate and step time per attempt, bounded in points whatever the run's length, each
bucket's lowest and highest value kept (a spike survives), restarts and completed checkpoints marked (the collector's
answer: tests/collector/test_curves_api.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from services.analysis.curves import CURVE_COLUMNS, build_training_curves, min_max_indices
from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from tests.analysis.scenarios import T0, ev, per_rank


def long_run() -> pd.DataFrame:
    """Attempt 0: steps 1-6,000; attempt 1 resumes from 4,000: steps 4,001-9,000. The loss falls smoothly but for
    one spike at attempt 1's step 7,777; step 5,000 of attempt 0 took 30 s (the others 1 s)."""
    rows = []
    t = T0
    for attempt, (first, last) in enumerate(((1, 6000), (4001, 9000))):
        for step in range(first, last + 1):
            seconds = 30.0 if (attempt, step) == (0, 5000) else 1.0
            loss = 9.0 if (attempt, step) == (1, 7777) else 2.0 * np.exp(-step / 3000.0)
            rows.append((attempt, step, t, t + seconds, loss, 1e-3 if step < 8000 else 1e-4))
            t += seconds
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


def views_with_marks() -> Any:
    """A tiny run whose views have one restart and two checkpoints (one of them failed)."""
    events = [ev("allocation_start", 0, gpus=2)]
    for attempt, start in ((0, 0), (1, 30)):
        events += [ev("attempt_start", start, attempt=attempt, rank=r, world_size=2) for r in range(2)]
    events += per_rank("checkpoint_start", 10, 2, attempt=0, step=5)
    events += per_rank("checkpoint_end", 12, 2, attempt=0, step=5, ok=True)
    events += per_rank("checkpoint_start", 20, 2, attempt=0, step=9)
    events += per_rank("checkpoint_end", 21, 2, attempt=0, step=9, ok=False)
    data = run_data_from_events("s1", events)
    return build_run_views(data, build_ledger(data), version=1)


def test_every_metric_stays_within_its_bound_and_keeps_each_attempts_extremes() -> None:
    steps = long_run()
    curves = build_training_curves(steps, views_with_marks(), max_points=2000)
    assert curves.downsampled
    for name in ("loss", "lr", "step_seconds"):
        series = getattr(curves, name)
        assert [s.attempt for s in series] == [0, 1]
        assert sum(len(s.value) for s in series) <= 2000
        assert [s.points_total for s in series] == [6000, 5000]
        for s in series:
            assert s.step == sorted(s.step) and s.time == sorted(s.time)
            mine = steps[steps["attempt"] == s.attempt]
            values = {"loss": mine["loss"], "lr": mine["lr"], "step_seconds": mine["end"] - mine["start"]}[name]
            assert max(s.value) == values.max() and min(s.value) == values.min()
            assert (s.step[0], s.step[-1]) == (int(mine["step"].min()), int(mine["step"].max()))
    spike = curves.loss[1]
    assert spike.value[spike.step.index(7777)] == 9.0
    slow = curves.step_seconds[0]
    assert slow.value[slow.step.index(5000)] == 30.0


def test_a_short_run_is_drawn_whole_and_its_marks_are_the_views() -> None:
    steps = long_run().head(50)
    curves = build_training_curves(steps, views_with_marks())
    assert not curves.downsampled
    (loss,) = curves.loss
    assert loss.value == steps["loss"].tolist() and loss.time == steps["end"].tolist()
    assert [(m.time - T0, m.step) for m in curves.restarts] == [(30.0, None)]
    assert [(m.time - T0, m.step) for m in curves.checkpoints] == [(12.0, 5)]  # the failed write is not marked


def test_min_max_downsampling_keeps_the_first_last_lowest_and_highest_point() -> None:
    values = np.sin(np.arange(10_000) / 50.0)
    values[1234] = 5.0
    values[8765] = -5.0
    kept = min_max_indices(values, 200)
    assert len(kept) <= 200 and kept[0] == 0 and kept[-1] == 9999
    assert {1234, 8765} <= set(kept.tolist())
    assert min_max_indices(values[:10], 200).tolist() == list(range(10))
