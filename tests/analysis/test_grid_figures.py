"""A run page's per-rank figures from a ragged ranks x steps compute grid (services.analysis.grid_figures), reduced
rows of one length at a time, are the figures of each rank alone and the straggler evidence of
`stragglers.rank_consistency` over the grid's known values, to the bit."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from services.analysis.grid_figures import grid_consistency, row_figures
from services.analysis.stragglers import rank_consistency


def row_by_row(values: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each rank alone, as the run page computed them before."""
    mine = [values[i][present[i]] for i in range(len(values))]
    return (np.array([np.median(v) for v in mine]), np.array([np.quantile(v, 0.9) for v in mine]),
            np.array([v.mean() for v in mine]))


def grid(seed: int, ranks: int, steps: int, missing: float, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(-1.0, 0.4, (ranks, steps)) * rng.choice([1e-3, 1.0, 41.7])
    if ties:  # compute times reported to the millisecond: many equal values, medians between two of them
        values = np.round(values, 3)
    values[rng.random((ranks, steps)) < missing] = np.nan
    values[:, 0] = rng.lognormal(-1.0, 0.4, ranks)  # every rank with one value at least, as a run's grid has
    return values, ~np.isnan(values)


def consistency_of_rows(values: np.ndarray, known: np.ndarray, attempts: np.ndarray, steps: np.ndarray
                        ) -> tuple[pd.DataFrame, float]:
    """What the run page computed before: the known values as rows, through rank_consistency."""
    rows, cols = np.nonzero(known)
    return rank_consistency(pd.DataFrame({"attempt": attempts[cols], "rank": rows.astype(np.int64),
                                          "step": steps[cols], "compute": values[rows, cols]}))


def assert_same_consistency(ours: tuple[pd.DataFrame, float], theirs: tuple[pd.DataFrame, float]) -> None:
    (frame, reference), (expected, expected_reference) = ours, theirs
    assert reference == expected_reference
    assert list(frame.index) == list(expected.index) and list(frame.columns) == list(expected.columns)
    for column in frame.columns:
        ours_column = frame[column].to_numpy()
        assert ours_column.tobytes() == expected[column].to_numpy().astype(ours_column.dtype).tobytes()
    if len(expected):  # (an empty answer's columns are of no type in one path, typed in the other)
        assert list(frame.dtypes) == list(expected.dtypes)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ranks=st.integers(1, 300), steps=st.integers(1, 400),
       missing=st.sampled_from([0.0, 0.002, 0.05, 0.5]), ties=st.booleans())
def test_the_figures_of_a_ragged_grid_are_each_ranks_own_to_the_bit(seed: int, ranks: int, steps: int,
                                                                    missing: float, ties: bool) -> None:
    values, present = grid(seed, ranks, steps, missing, ties)
    for name, ours, theirs in zip(("median", "p90", "mean"), row_figures(values, present),
                                  row_by_row(values, present), strict=True):
        assert ours.tobytes() == theirs.tobytes(), name


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ranks=st.integers(1, 120), steps=st.integers(1, 200),
       missing=st.sampled_from([0.0, 0.01, 0.2, 0.9]), unknown=st.sampled_from([0.0, 0.05, 0.5]),
       ties=st.booleans(), attempts=st.integers(1, 3))
def test_the_straggler_evidence_of_a_ragged_grid_is_rank_consistencys(
        seed: int, ranks: int, steps: int, missing: float, unknown: float, ties: bool, attempts: int) -> None:
    """Steps without some ranks, values without collective timings (not known), steps known for one rank only,
    several attempts reusing step numbers."""
    values, present = grid(seed, ranks, steps, missing, ties)
    rng = np.random.default_rng(seed + 1)
    known = present & (rng.random(present.shape) >= unknown)
    attempt = np.sort(rng.integers(0, attempts, steps))
    step = np.concatenate([np.arange((attempt == a).sum()) for a in range(attempts)])
    assert_same_consistency(grid_consistency(np.arange(ranks), values, known),
                            consistency_of_rows(values, known, attempt, step))


def test_a_live_runs_last_steps_missing_on_some_ranks() -> None:
    """The usual ragged grid: 256 ranks, the last two steps not reported yet by a third of them."""
    values, _ = grid(7, 256, 1200, 0.0, ties=False)
    values[::3, -2:] = np.nan
    values[1::7, -1] = np.nan
    present = ~np.isnan(values)
    for ours, theirs in zip(row_figures(values, present), row_by_row(values, present), strict=True):
        assert ours.tobytes() == theirs.tobytes()
    columns = np.arange(values.shape[1])
    assert_same_consistency(grid_consistency(np.arange(256), values, present),
                            consistency_of_rows(values, present, np.zeros_like(columns), columns))


def test_a_rank_without_values_has_no_figures_and_no_evidence() -> None:
    values = np.array([[1.0, 2.0, 4.0], [np.nan, np.nan, np.nan], [3.0, np.nan, 5.0]])
    present = ~np.isnan(values)
    median, p90, mean = row_figures(values, present)
    assert median.tolist()[0::2] == [2.0, 4.0] and mean.tolist()[0::2] == [7.0 / 3.0, 4.0]
    assert np.isnan([median[1], p90[1], mean[1]]).all()
    by_rank, reference = grid_consistency(np.array([3, 5, 9]), values, present)
    assert list(by_rank.index) == [3, 9] and by_rank["steps"].tolist() == [2, 2] and reference == 3.0
    nothing, zero = grid_consistency(np.array([3, 5, 9]), values, np.zeros_like(present))
    assert nothing.empty and zero == 0.0
