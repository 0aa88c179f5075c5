"""Medians the straggler figures need, as plain numpy (imported by stragglers and step_blocks alike)."""

from __future__ import annotations

import numpy as np


def others_median_by_step(matrix: np.ndarray) -> np.ndarray:
    """`others_median` for a (steps x ranks) matrix where every rank reported every step: O(n) per step.

    In a step sorted v[0..n-1], the median of the others of x is, for n even, v[n/2] when x <= v[n/2-1], else
    v[n/2-1]; for n odd (middle c), (v[c]+v[c+1])/2 when x < v[c], (v[c-1]+v[c])/2 when x > v[c], and
    (v[c-1]+v[c+1])/2 when x == v[c] (ties give the same value whichever copy x is)."""
    n = matrix.shape[1]
    if n < 2:
        return np.full(matrix.shape, np.nan)
    if n % 2 == 0:
        h = n // 2
        part = np.partition(matrix, (h - 1, h), axis=1)
        lo, hi = part[:, h - 1 : h], part[:, h : h + 1]
        return np.where(matrix <= lo, hi, lo)
    c = n // 2
    part = np.sort(matrix, axis=1) if n == 3 else np.partition(matrix, (c - 1, c, c + 1), axis=1)
    below, mid, above = part[:, c - 1 : c], part[:, c : c + 1], part[:, c + 1 : c + 2]
    out: np.ndarray = np.where(matrix < mid, (mid + above) / 2.0, np.where(matrix > mid, (below + mid) / 2.0,
                                                                           (below + above) / 2.0))
    return out


def median_of_sorted_rows(ordered: np.ndarray) -> np.ndarray:
    """`np.median(x, axis=1)` of a matrix whose rows are sorted (no NaN, at least one column), in O(rows): the
    middle value, or the mean of the two middle values computed as numpy does ((a + b) / 2)."""
    n = ordered.shape[1]
    h = n // 2
    if n % 2:
        return ordered[:, h].copy()
    out: np.ndarray = (ordered[:, h - 1] + ordered[:, h]) / 2.0
    return out
