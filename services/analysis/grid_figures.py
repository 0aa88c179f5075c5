"""A run page's per-rank figures from its ranks x job steps compute grid when the grid is ragged.

A live run's grid is ragged at its last steps: some ranks have not reported them yet. Its figures were computed
rank by rank (three numpy reductions per rank) and its straggler evidence through a frame of every known value
grouped with pandas: for 256 ranks, most of the background analyst's time at fleet shape. Here rows of the same
length are reduced together along the axis, and the steps every rank reported take the full grid's
`others_median_by_step`: numpy reduces each row of a matrix as it reduces that row alone, so the figures are the
ones the rank-by-rank computation gives, to the bit (tests/analysis/test_grid_figures.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from services.analysis.medians import others_median, others_median_by_step

CONSISTENCY_COLUMNS = ["steps", "slower_steps", "median_excess"]


def row_figures(values: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's median, 0.9 quantile and mean over its present values (NaN for a row with none)."""
    if bool(present.all()):
        return np.median(values, axis=1), np.quantile(values, 0.9, axis=1), values.mean(axis=1)
    median, p90, mean = (np.full(len(values), np.nan) for _ in range(3))
    for rows, same in _rows_by_count(values, present):
        median[rows], p90[rows], mean[rows] = np.median(same, axis=1), np.quantile(same, 0.9, axis=1), same.mean(axis=1)
    return median, p90, mean


def grid_consistency(ranks: np.ndarray, values: np.ndarray, known: np.ndarray) -> tuple[pd.DataFrame, float]:
    """`stragglers.rank_consistency` of the grid's known values (`values`: ranks x job steps, each column one
    (attempt, step)), ragged or not: per rank that was compared in some step, the steps compared, those slower than
    the others' median, and the median excess over it; and the median of every known value. A grid known in full
    takes `others_median_by_step` throughout, as `stragglers.consistency_of_grid` does."""
    if not bool(known.any()):
        return pd.DataFrame(columns=CONSISTENCY_COLUMNS, index=pd.Index([], name="rank")), 0.0
    excess = np.full(values.shape, np.nan)
    full = known.all(axis=0)
    if bool(full.any()):
        by_step = values[:, full].T  # steps x ranks, as others_median_by_step reads them
        excess[:, full] = (by_step - others_median_by_step(by_step)).T
    rows, cols = np.nonzero(known & ~full)
    if len(rows):
        excess[rows, cols] = values[rows, cols] - others_median(cols, values[rows, cols])
    compared = ~np.isnan(excess)  # a rank alone in its step has no others to compare with
    counts = compared.sum(axis=1)
    median_excess = np.full(len(ranks), np.nan)
    for group, same in _rows_by_count(excess, compared):
        median_excess[group] = np.median(same, axis=1)
    kept = counts > 0
    by_rank = pd.DataFrame({"steps": counts[kept], "slower_steps": (excess > 0).sum(axis=1)[kept],
                            "median_excess": median_excess[kept]}, index=pd.Index(ranks[kept], name="rank"))
    return by_rank[CONSISTENCY_COLUMNS], float(np.median(values[known]))


def _rows_by_count(values: np.ndarray, present: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(rows, their present values as a rows x count matrix) for each count of present values above 0."""
    counts = present.sum(axis=1)
    out = []
    for count in np.unique(counts[counts > 0]):
        rows = np.flatnonzero(counts == count)
        out.append((rows, values[rows][present[rows]].reshape(len(rows), int(count))))  # a mask reads row by row
    return out
