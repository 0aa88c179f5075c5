"""When a run's GPU time went where: the ledger's figures laid out on the wall clock, so that a time range can be
cut out of them (the fleet page's "last hour", its over-time chart) without spreading a run's totals over its life.

A `Usage` is a list of disjoint pieces of wall time, sorted, each with the GPU-seconds it holds per key of
`USAGE_KEYS` (productive, eval and every waste category). Inside a piece GPU time runs at an even rate; so cutting
[t0, t1) out of a piece takes the overlapping share of each of its figures. The pieces add up to the ledger:
`sum(piece figures) == ledger figures` per key.

How it is built from the painting (services.analysis.claims), rule by rule as the ledger counts:
- each painted segment holds `length x min(world size, GPUs)` of its claim's category and the rest of its GPUs as
  idle: the painting's segments are already even (one claim, one GPU count each);
- straggler time is carved out of kept steps, step by step: a kept step's straggler cost is taken from the
  productive time of that step's own wall time, at an even rate over the step;
- neighbours with the same rates merge (nothing is lost); when more than `max_pieces` remain, pieces are summed
  into bins of one width aligned to the epoch (1 s, 5 s, ... 1 day), the smallest that fits: a bin then holds
  its exact totals, spread evenly only inside it.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from services.analysis.claims import CLAIM_CATEGORY, RunPainting
from services.schemas.categories import PRODUCTIVE, WasteCategory
from services.schemas.usage import USAGE_KEYS, Usage

MAX_PIECES = 720
BIN_WIDTHS_S: tuple[float, ...] = (1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600, 7200, 6 * 3600, 12 * 3600, 86400,
                                   7 * 86400)


def usage_matrix(usage: Usage) -> np.ndarray:
    """(pieces x USAGE_KEYS) GPU-seconds."""
    out = np.zeros((len(usage.start), len(USAGE_KEYS)))
    for j, key in enumerate(USAGE_KEYS):
        values = usage.gpu_seconds.get(key)
        if values:
            out[:, j] = values
    return out


def usage_of_pieces(start: np.ndarray, end: np.ndarray, values: np.ndarray, *,
                    max_pieces: int = MAX_PIECES) -> Usage:
    """The Usage of even pieces (sorted, disjoint; `values`: pieces x USAGE_KEYS GPU-seconds): empty pieces dropped,
    neighbours of equal rates merged, binned when still more than `max_pieces`."""
    start, end, values = (np.asarray(start, np.float64), np.asarray(end, np.float64),
                          np.asarray(values, np.float64).reshape(len(start), len(USAGE_KEYS)))
    keep = (end > start) & (np.abs(values).sum(axis=1) > 0)
    start, end, values = start[keep], end[keep], values[keep]
    start, end, values = _merge_even(start, end, values)
    bin_s = None
    if len(start) > max_pieces:
        bin_s = _bin_width(float(start[0]), float(end[-1]), max_pieces)
        start, end, values = _binned(start, end, values, bin_s)
    return _usage(start, end, values, bin_s)


@dataclass(frozen=True, slots=True)
class UsagePieces:
    """A Usage as arrays (what the fleet's pages cut, without building lists): piece i spans [start[i], end[i]) and
    holds values[i, j] GPU-seconds of USAGE_KEYS[j]."""

    start: np.ndarray
    end: np.ndarray
    values: np.ndarray


def pieces_of(usage: Usage) -> UsagePieces:
    return UsagePieces(np.asarray(usage.start, np.float64), np.asarray(usage.end, np.float64), usage_matrix(usage))


def clip_usage(usage: Usage | UsagePieces, since: float | None, until: float | None) -> dict[str, float]:
    """GPU-seconds per key of USAGE_KEYS inside [since, until) (None: unbounded on that side)."""
    lo = -np.inf if since is None else float(since)
    hi = np.inf if until is None else float(until)
    if hi <= lo:
        return dict.fromkeys(USAGE_KEYS, 0.0)
    sums = usage_in_bins(usage, np.array([lo, hi]))[0]
    return {key: float(v) for key, v in zip(USAGE_KEYS, sums, strict=True)}


def usage_in_bins(usage: Usage | UsagePieces, edges: np.ndarray) -> np.ndarray:
    """(len(edges) - 1) x USAGE_KEYS GPU-seconds of each bin [edges[i], edges[i + 1]): exact for the pieces, each
    piece's figures taken in proportion to its time inside the bin."""
    pieces = pieces_of(usage) if isinstance(usage, Usage) else usage
    edges = np.asarray(edges, np.float64)
    if len(edges) < 2 or not len(pieces.start):
        return np.zeros((max(len(edges) - 1, 0), len(USAGE_KEYS)))
    return np.diff(_cumulative_at(pieces, edges), axis=0)


def usage_windows(usages: Sequence[UsagePieces], since: float | None, until: float, edges: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Many runs' `clip_usage(usage, since, until)` (runs x USAGE_KEYS) and `usage_in_bins(usage, edges)` (runs x
    bins x USAGE_KEYS) at once, to the bit the same as one run at a time: the fleet page cuts thousands of runs per
    request, and one interpolation per key per run cost more than the rest of it. np.interp's own arithmetic, done
    over all runs' pieces together (services.analysis.usage._interp_all)."""
    lo = -np.inf if since is None else float(since)
    edges = np.asarray(edges, np.float64)
    points = np.concatenate([[lo, until], edges])
    at = np.zeros((len(usages), len(points), len(USAGE_KEYS)))
    for first in range(0, len(usages), _RUNS_AT_ONCE):
        chunk = usages[first:first + _RUNS_AT_ONCE]
        at[first:first + len(chunk)] = _interp_all(chunk, points)
    sums = at[:, 1] - at[:, 0] if until > lo else np.zeros((len(usages), len(USAGE_KEYS)))
    buckets = np.diff(at[:, 2:], axis=1) if len(edges) >= 2 else np.zeros((len(usages), 0, len(USAGE_KEYS)))
    return sums, buckets


_RUNS_AT_ONCE = 512  # runs interpolated together: bounds the (runs x points x keys) temporaries


def _interp_all(usages: Sequence[UsagePieces], points: np.ndarray) -> np.ndarray:
    """runs x points x USAGE_KEYS: `_cumulative_at(usage, points)` of each run, with np.interp's arithmetic (the
    piece's slope times the distance from its left end, plus its left value; a point on a knot takes the knot's
    value) over all runs at once. A run without pieces is 0."""
    keys = len(USAGE_KEYS)
    out = np.zeros((len(usages), len(points), keys))
    runs = [r for r, u in enumerate(usages) if len(u.start)]
    if not runs:
        return out
    xs, ys, index = [], [], []
    base = 0
    for r in runs:
        usage = usages[r]
        x = np.column_stack([usage.start, usage.end]).reshape(-1)
        cum = np.cumsum(usage.values, axis=0)
        y = np.empty((len(x), keys))
        y[0::2] = np.vstack([np.zeros((1, keys)), cum[:-1]])
        y[1::2] = cum
        finite = np.minimum(np.maximum(points, x[0]), x[-1])
        index.append(np.searchsorted(x, finite, side="right") - 1 + base)
        xs.append(x)
        ys.append(y)
        base += len(x)
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    lefts = np.array([0, *np.cumsum([len(x) for x in xs])[:-1]])
    rights = lefts + np.array([len(x) for x in xs]) - 1
    j = np.stack(index)  # runs x points: the knot at or before each (clamped) point
    finite = np.minimum(np.maximum(points[None, :], x_all[lefts][:, None]), x_all[rights][:, None])
    on_knot = (j == rights[:, None]) | (x_all[j] == finite)
    k = np.minimum(j + 1, rights[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (y_all[k] - y_all[j]) / (x_all[k] - x_all[j])[..., None]
        value = slope * (finite - x_all[j])[..., None] + y_all[j]
        nan = np.isnan(value) & ~on_knot[..., None]
        if nan.any():  # np.interp's fallback: from the right knot, then the flat value
            value = np.where(nan, slope * (finite - x_all[k])[..., None] + y_all[k], value)
            value = np.where(np.isnan(value) & nan & (y_all[j] == y_all[k]), y_all[j], value)
    value = np.where(on_knot[..., None], y_all[j], value)
    nonzero = np.stack([usages[r].values.any(axis=0) for r in runs])  # keys zero everywhere: 0, as _cumulative_at
    out[runs] = np.where(nonzero[:, None, :], value, 0.0)
    return out


def _cumulative_at(pieces: UsagePieces, points: np.ndarray) -> np.ndarray:
    """len(points) x USAGE_KEYS: the cumulative GPU time F(t) of each key at each point. F is piecewise linear (even
    inside a piece, flat between pieces), so a bin holds F(right edge) - F(left edge). Keys that are zero
    everywhere are 0 without interpolating (the same value: F is 0 everywhere)."""
    start, end, values = pieces.start, pieces.end, pieces.values
    x = np.column_stack([start, end]).reshape(-1)
    cum = np.cumsum(values, axis=0)
    y = np.empty((len(x), values.shape[1]))
    y[0::2] = np.vstack([np.zeros((1, values.shape[1])), cum[:-1]])
    y[1::2] = cum
    finite = np.minimum(np.maximum(points, x[0]), x[-1])  # np.clip, without its overhead per call
    out = np.zeros((len(points), values.shape[1]))
    for j in np.flatnonzero(values.any(axis=0)):
        out[:, j] = np.interp(finite, x, y[:, j])
    return out


def with_interval(usage: Usage, t0: float, t1: float, rates: Mapping[str, float]) -> Usage:
    """`usage` with GPUs moved or added over [t0, t1): `rates[key]` GPUs (negative: taken away) per second of it
    (the provisional hang of a hung run: idle -> hang, and time allocated since). Pieces are cut at t0 and t1;
    time not covered by a piece becomes a new piece."""
    if t1 <= t0 or not any(rates.values()):
        return usage
    start, end, values = np.asarray(usage.start), np.asarray(usage.end), usage_matrix(usage)
    cuts = np.array([t0, t1])
    start, end, values = _cut(start, end, values, cuts)
    # the uncovered gaps inside [t0, t1)
    gaps_s, gaps_e = [], []
    cursor = t0
    for s, e in zip(start, end, strict=True):
        if e <= t0 or s >= t1:
            continue
        if s > cursor:
            gaps_s.append(cursor)
            gaps_e.append(s)
        cursor = max(cursor, e)
    if cursor < t1:
        gaps_s.append(cursor)
        gaps_e.append(t1)
    if gaps_s:
        start = np.concatenate([start, gaps_s])
        end = np.concatenate([end, gaps_e])
        values = np.vstack([values, np.zeros((len(gaps_s), values.shape[1]))])
        order = np.argsort(start, kind="stable")
        start, end, values = start[order], end[order], values[order]
    inside = (start >= t0) & (end <= t1)
    rate = np.array([float(rates.get(key, 0.0)) for key in USAGE_KEYS])
    values = values + np.outer(np.where(inside, end - start, 0.0), rate)
    return _usage(start, end, values, usage.bin_s)


def bucket_width(span_s: float, max_buckets: int) -> float:
    """The width of the buckets of a chart over `span_s` seconds: the smallest of BIN_WIDTHS_S (at least 1 min)
    with at most `max_buckets` buckets."""
    for width in BIN_WIDTHS_S:
        if width >= 60 and width * max_buckets >= span_s:
            return float(width)
    # longer than the widest listed width allows: whole multiples of it, still at most `max_buckets` buckets
    widest = BIN_WIDTHS_S[-1]
    return float(widest * math.ceil(span_s / (widest * max_buckets)))


def usage_of_painting(painting: RunPainting, claimed_gpu_s: np.ndarray, idle_gpu_s: np.ndarray,
                      straggle: pd.DataFrame, straggler_gpu_s: float, *, max_pieces: int = MAX_PIECES) -> Usage:
    """The run's Usage from its painting and the ledger's own per-segment figures (`claimed_gpu_s`, `idle_gpu_s`:
    GPU-seconds of each painted segment) and straggler cost (`straggle`: attempt, step, cost per kept step;
    `straggler_gpu_s`: the ledger's total, which the per-step costs are scaled to)."""
    bounds = painting.bounds
    n = len(bounds) - 1
    if n <= 0:
        return usage_of_pieces(np.zeros(0), np.zeros(0), np.zeros((0, len(USAGE_KEYS))), max_pieces=max_pieces)
    values = np.zeros((n, len(USAGE_KEYS)))
    column = {key: j for j, key in enumerate(USAGE_KEYS)}
    for claim, category in CLAIM_CATEGORY.items():
        sel = painting.claim == claim
        values[sel, column[category]] = claimed_gpu_s[sel]
    values[:, column[WasteCategory.IDLE.value]] = idle_gpu_s
    if straggler_gpu_s > 0:
        productive = values[:, column[PRODUCTIVE]]
        carved = _straggle_by_segment(painting, straggle, productive, straggler_gpu_s)
        values[:, column[PRODUCTIVE]] = productive - carved
        values[:, column[WasteCategory.STRAGGLER.value]] = carved
    return usage_of_pieces(bounds[:-1], bounds[1:], values, max_pieces=max_pieces)


def _straggle_by_segment(painting: RunPainting, straggle: pd.DataFrame, productive: np.ndarray,
                         total: float) -> np.ndarray:
    """The straggler GPU-seconds of each painted segment: each kept step's cost at an even rate over the step's wall
    time, never more than the segment's productive time, scaled to the ledger's total."""
    bounds, lengths = painting.bounds, painting.lengths
    rate = np.zeros(len(lengths))
    steps = painting.job_steps
    if not straggle.empty and not steps.empty:
        timed = straggle[["attempt", "step", "cost"]].merge(steps[["attempt", "step", "start", "end"]],
                                                            on=["attempt", "step"], how="inner")
        timed = timed[timed["end"] > timed["start"]]
        if not timed.empty:
            lo = np.searchsorted(bounds, timed["start"].to_numpy(np.float64), side="left")
            hi = np.searchsorted(bounds, timed["end"].to_numpy(np.float64), side="left")
            per_s = timed["cost"].to_numpy(np.float64) / (timed["end"] - timed["start"]).to_numpy(np.float64)
            diff = np.zeros(len(bounds) + 1)
            np.add.at(diff, lo, per_s)
            np.add.at(diff, hi, -per_s)
            rate = np.cumsum(diff)[: len(lengths)]
    carved: np.ndarray = np.minimum(rate * lengths, productive)
    placed = float(carved.sum())
    if placed > total:  # the ledger scaled the costs down (steps overlapping in time): so do we
        carved = carved * (total / placed)
    elif placed < total:  # the rest where kept time is left, in proportion to it (no step timing to place it by)
        room = productive - carved
        if float(room.sum()) > 0:
            carved = carved + room * ((total - placed) / float(room.sum()))
    return carved


# -- pieces ---------------------------------------------------------------------------------------------------------


def _usage(start: np.ndarray, end: np.ndarray, values: np.ndarray, bin_s: float | None) -> Usage:
    return Usage(start=_floats(start), end=_floats(end), bin_s=bin_s,
                 gpu_seconds={key: _floats(values[:, j]) for j, key in enumerate(USAGE_KEYS)
                              if bool((values[:, j] != 0).any())})


def _floats(array: np.ndarray) -> list[float]:
    """Python floats, float(v) of each value, in one call."""
    listed: list[float] = np.asarray(array, dtype=np.float64).tolist()
    return listed


def _merge_even(start: np.ndarray, end: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Touching neighbours with the same GPU rates per key become one piece."""
    if len(start) < 2:
        return start, end, values
    rates = values / (end - start)[:, None]
    same = np.all(np.isclose(rates[1:], rates[:-1], rtol=1e-9, atol=1e-12), axis=1) & (start[1:] == end[:-1])
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, len(start) - 1]
    return start[first], end[last], np.add.reduceat(values, first, axis=0)


def _bin_width(lo: float, hi: float, max_pieces: int) -> float:
    for width in BIN_WIDTHS_S:
        if np.floor(hi / width) - np.floor(lo / width) + 1 <= max_pieces:
            return float(width)
    return float(BIN_WIDTHS_S[-1])


def _binned(start: np.ndarray, end: np.ndarray, values: np.ndarray, width: float) -> tuple[np.ndarray, ...]:
    edges = np.arange(np.floor(start[0] / width) * width, end[-1] + width, width)
    usage = _usage(start, end, values, None)
    sums = usage_in_bins(usage, edges)
    return edges[:-1], np.minimum(edges[1:], end[-1]), sums


def _cut(start: np.ndarray, end: np.ndarray, values: np.ndarray, cuts: Sequence[float] | np.ndarray
         ) -> tuple[np.ndarray, ...]:
    """Pieces split at each of `cuts` that falls strictly inside one; the figures shared by time."""
    for t in cuts:
        inside = np.flatnonzero((start < t) & (end > t))
        if not len(inside):
            continue
        i = int(inside[0])
        share = (t - start[i]) / (end[i] - start[i])
        start = np.insert(start, i + 1, t)
        end = np.insert(end, i, t)
        left = values[i] * share
        values = np.insert(values, i + 1, values[i] - left, axis=0)
        values[i] = left
    return start, end, values
