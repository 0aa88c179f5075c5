"""Medians the straggler figures need, as plain numpy (imported by stragglers, step_blocks and rank_sketch alike)."""

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


def others_median(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each element, the median of the *other* elements of its group (NaN when it is alone).

    `group`: one integer key per element (e.g. one per (attempt, step)); vectorised, O(n log n)."""
    n = len(values)
    out = np.full(n, np.nan)
    if n == 0:
        return out
    by_value = np.argsort(values, kind="quicksort")
    order = by_value[np.argsort(group[by_value], kind="stable")]  # by group, then value; faster than lexsort
    g, v = group[order], values[order].astype(np.float64)
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[first, n])
    start = np.repeat(first, sizes)
    others = np.repeat(sizes, sizes) - 1
    pos = np.arange(n) - start

    def other_at(q: np.ndarray) -> np.ndarray:  # the q-th smallest of the others, as an index into v
        index: np.ndarray = start + q + (q >= pos)
        return index

    lo_q = np.maximum((others - 1) // 2, 0)
    hi_q = np.maximum(others // 2, 0)
    alone = others == 0
    lo = v[np.where(alone, start, other_at(lo_q))]
    hi = v[np.where(alone, start, other_at(hi_q))]
    out[order] = np.where(alone, np.nan, (lo + hi) / 2.0)
    return out
