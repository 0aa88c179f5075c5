"""benchmarks.grid_figures times the same work both ways: its live grid is ragged the way a live run's is, and its
rank-by-rank way gives the figures the grid way gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks import grid_figures
from services.analysis.grid_figures import grid_consistency, row_figures
from services.analysis.stragglers import rank_consistency


def test_the_live_grid_is_ragged_at_its_last_steps_only() -> None:
    values = grid_figures.live_grid(256, 150)
    present = ~np.isnan(values)
    assert present[:, :-2].all() and not present[:, -2:].all()
    assert set(present.sum(axis=1)) == {148, 149, 150}


def test_both_ways_compute_the_same_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[pd.DataFrame, float]] = []
    monkeypatch.setattr(grid_figures, "rank_consistency", lambda frame: seen.append(rank_consistency(frame)))
    values = grid_figures.live_grid(40, 60)
    grid_figures.by_rows(values)
    present = ~np.isnan(values)
    (expected, reference), = seen
    ours, our_reference = grid_consistency(np.arange(40), values, present)
    assert our_reference == reference and ours.equals(expected)
    median, _, _ = row_figures(values, present)
    assert median.tolist() == [np.median(row[~np.isnan(row)]) for row in values]


def test_it_prints_a_ratio_per_grid(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["grid_figures", "--ranks", "16", "--steps", "20,40", "--repeat", "1"])
    grid_figures.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["20", "40"]
