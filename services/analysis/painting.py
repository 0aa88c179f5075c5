"""Interval painting: split wall time at every boundary and give each piece to the strongest claim.

Claims are (start, end, key) intervals; a higher key wins where claims overlap. The result covers exactly the
union of the `base` intervals (the allocations), so nothing outside them is counted and nothing inside twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Painted:
    """Elementary segments [bounds[i], bounds[i+1]) with the base value and winning key of each (-1 = none)."""

    bounds: np.ndarray
    base: np.ndarray
    key: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)


def paint(
    base_start: np.ndarray, base_end: np.ndarray, base_value: np.ndarray,
    claim_start: np.ndarray, claim_end: np.ndarray, claim_key: np.ndarray,
) -> Painted:
    bounds = np.unique(np.concatenate([base_start, base_end, claim_start, claim_end]).astype(np.float64))
    n_seg = max(len(bounds) - 1, 0)
    base = _paint_max(bounds, n_seg, base_start, base_end, base_value.astype(np.int64))
    key = _paint_max(bounds, n_seg, claim_start, claim_end, claim_key.astype(np.int64))
    return Painted(bounds=bounds, base=np.where(base < 0, 0, base), key=key)


def _paint_max(bounds: np.ndarray, n_seg: int, starts: np.ndarray, ends: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per segment, the largest key among the intervals covering it (-1 where none does)."""
    out = np.full(n_seg, -1, dtype=np.int64)
    if n_seg == 0 or len(starts) == 0:
        return out
    lo = np.searchsorted(bounds, starts, side="left")
    hi = np.searchsorted(bounds, ends, side="left")
    valid = hi > lo
    lo, hi, keys = lo[valid], hi[valid], keys[valid]
    for k in np.unique(keys):  # few distinct keys: categories x attempts
        sel = keys == k
        k_lo, k_hi = lo[sel], hi[sel]
        first, last = int(k_lo.min()), int(k_hi.max())
        size = last - first + 1
        diff = np.bincount(k_lo - first, minlength=size) - np.bincount(k_hi - first, minlength=size)
        covered = np.cumsum(diff[:-1]) > 0
        window = out[first:last]
        out[first:last] = np.where(covered & (window < k), k, window)
    return out
