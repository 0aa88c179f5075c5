"""A run's per-rank compute figures in memory that does not grow with the run's length.

The run page's per-rank table (median, p90, mean compute; the flag rule's evidence) and its heat map read every
(rank, step) compute value of a run. Kept whole, a live run's values grow by 17 B per rank and step in every
collector process that builds its page. Past `EXACT_RANK_VALUES` values a run's closed blocks are folded into a
`RankSketch` instead, which holds per rank:

- the count, sum, minimum and maximum of its compute values: steps and mean exact;
- the values counted in log-spaced bins (DDSketch's layout, dense over the range seen): any order statistic, so the
  median and p90, to within a relative `COMPUTE_ERROR` (0.5 %), clamped to the rank's exact minimum and maximum
  (a rank whose steps all took the same time gets it exactly);
- the flag rule's evidence: steps compared, steps slower than the other ranks' median (both exact), and its
  median excess over that median, each middle value to within `EXCESS_ERROR` (2 %) of itself (the median of an
  even count is the mean of two: within 2 % of the larger); the yardstick (the median of every known value) from
  one run-wide histogram, to within 0.5 %;
- mean compute per step chunk for the heat map: at most `HEAT_CHUNKS` chunks, twice as long whenever the run
  outgrows them, each drawn in the heat-map column of its middle step.

Memory: about 4 x (compute bins + excess bins) + 8 x HEAT_CHUNKS + 64 bytes per rank, whatever the run's length:
bins span the magnitudes seen (1 % apart for compute, 4 % for excess), at most `MAX_BINS` per sign (past that the
smallest magnitudes share the lowest bin, DDSketch's collapse). A run whose compute spans 0.5-2 s and whose
excesses span 1 us-0.3 s holds ~3 KiB per rank.

Figures of a sketch do not depend on the order in which blocks were added, except for float sums (the mean), which
can differ in the last bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from services.analysis.medians import others_median
from services.analysis.step_blocks import StepBlock

EXACT_RANK_VALUES = 1 << 15  # (rank, step) values of a run kept whole; past this, closed blocks go to a sketch
COMPUTE_GAMMA = 1.01
EXCESS_GAMMA = 1.04
COMPUTE_ERROR = (COMPUTE_GAMMA - 1) / (COMPUTE_GAMMA + 1)  # the largest relative error of a compute figure
EXCESS_ERROR = (EXCESS_GAMMA - 1) / (EXCESS_GAMMA + 1)
TINY_SECONDS = 1e-9  # compute below this counts as zero
TINY_EXCESS = 1e-6  # an excess below a microsecond counts as zero
MAX_BINS = 2048
HEAT_CHUNKS = 128
_QUANTILE_ROWS = 1024


class LogCounts:
    """Per row, counts of signed values in log-spaced magnitude bins: bin k holds magnitudes in
    [gamma^k, gamma^(k+1)), drawn as 2 gamma^(k+1) / (gamma + 1) (at most (gamma - 1) / (gamma + 1) off)."""

    def __init__(self, rows: int, gamma: float, tiny: float) -> None:
        self.gamma = gamma
        self.tiny = tiny
        self._log_gamma = math.log(gamma)
        self.pos = np.zeros((rows, 0), dtype=np.uint32)
        self.neg = np.zeros((rows, 0), dtype=np.uint32)
        self.pos_lo = 0  # the bin index of column 0
        self.neg_lo = 0
        self.zero = np.zeros(rows, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return int(self.pos.nbytes + self.neg.nbytes + self.zero.nbytes)

    def copy(self) -> LogCounts:
        out = LogCounts.__new__(LogCounts)
        out.gamma, out.tiny, out._log_gamma = self.gamma, self.tiny, self._log_gamma
        out.pos, out.neg, out.zero = self.pos.copy(), self.neg.copy(), self.zero.copy()
        out.pos_lo, out.neg_lo = self.pos_lo, self.neg_lo
        return out

    def grow_rows(self, rows: int, at: np.ndarray) -> None:
        """Rows are now `rows`; the old row i is row at[i]."""
        for name in ("pos", "neg"):
            old = getattr(self, name)
            new = np.zeros((rows, old.shape[1]), dtype=old.dtype)
            new[at] = old
            setattr(self, name, new)
        zero = np.zeros(rows, dtype=np.int64)
        zero[at] = self.zero
        self.zero = zero

    def bins(self, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whether each value counts as zero, its magnitude's bin: meaningless where zero)."""
        magnitude = np.abs(value)
        small = magnitude < self.tiny
        with np.errstate(divide="ignore"):
            k = np.floor(np.log(np.where(small, 1.0, magnitude)) / self._log_gamma).astype(np.int64)
        return small, k

    def add(self, row: np.ndarray, value: np.ndarray, bins: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Count `value` (1-d) in rows `row`; `bins`: `self.bins(value)` when already at hand."""
        small, k = bins if bins is not None else self.bins(value)
        if small.any():
            self.zero += np.bincount(row[small], minlength=len(self.zero))
        positive = (value > 0) & ~small
        if positive.all():  # compute: never negative, rarely zero
            self._add_side("pos", row, k)
            return
        for name, chosen in (("pos", positive), ("neg", (value < 0) & ~small)):
            if chosen.any():
                self._add_side(name, row[chosen], k[chosen])

    def _add_side(self, name: str, row: np.ndarray, k: np.ndarray) -> None:
        counts: np.ndarray = getattr(self, name)
        lo: int = getattr(self, f"{name}_lo")
        width = counts.shape[1]
        new_lo = int(k.min()) if width == 0 else min(lo, int(k.min()))
        new_hi = int(k.max()) if width == 0 else max(lo + width - 1, int(k.max()))
        new_lo = max(new_lo, new_hi - MAX_BINS + 1)  # the smallest magnitudes share the lowest bin
        if width == 0 or new_lo != lo or new_hi != lo + width - 1:
            grown = np.zeros((counts.shape[0], new_hi - new_lo + 1), dtype=np.uint32)
            if width:
                shift = lo - new_lo  # negative when the lowest bins collapse
                keep = max(0, -shift)
                grown[:, max(0, shift): max(0, shift) + width - keep] = counts[:, keep:]
                if keep:
                    grown[:, 0] += counts[:, :keep].sum(axis=1, dtype=np.uint32)
            counts, lo = grown, new_lo
        column = np.clip(k - lo, 0, counts.shape[1] - 1)
        flat = np.bincount(row * counts.shape[1] + column, minlength=counts.size)
        counts += flat.reshape(counts.shape).astype(np.uint32)
        setattr(self, name, counts)
        setattr(self, f"{name}_lo", lo)

    def quantile(self, q: float, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        """Per row, numpy's (linear) quantile q of its values, each order statistic drawn from its bin and clamped
        to the row's [low, high]; NaN for a row without values."""
        drawn = np.concatenate([-self._drawn(self.neg_lo, self.neg.shape[1])[::-1], [0.0],
                                self._drawn(self.pos_lo, self.pos.shape[1])])
        out = np.full(len(self.zero), np.nan)
        for first in range(0, len(self.zero), _QUANTILE_ROWS):  # bounded scratch memory whatever the ranks
            rows = slice(first, first + _QUANTILE_ROWS)
            counts = np.concatenate([self.neg[rows, ::-1].astype(np.int64), self.zero[rows, None],
                                     self.pos[rows].astype(np.int64)], axis=1)
            cumulative = np.cumsum(counts, axis=1, out=counts)
            n = cumulative[:, -1]
            has = n > 0
            if not has.any():
                continue
            h = (n[has] - 1) * q
            lo = np.floor(h).astype(np.int64)
            hi = np.minimum(lo + 1, n[has] - 1)
            below, above = (self._order_statistic(cumulative[has], drawn, at) for at in (lo, hi))
            below = np.clip(below, low[rows][has], high[rows][has])
            above = np.clip(above, low[rows][has], high[rows][has])
            part = out[rows]
            part[has] = below + (h - lo) * (above - below)
        return out

    def _drawn(self, lo: int, width: int) -> np.ndarray:
        k = np.arange(lo, lo + width, dtype=np.float64)
        return 2.0 * np.power(self.gamma, k + 1) / (self.gamma + 1)

    @staticmethod
    def _order_statistic(cumulative: np.ndarray, drawn: np.ndarray, at: np.ndarray) -> np.ndarray:
        column = (cumulative <= at[:, None]).sum(axis=1)
        out: np.ndarray = drawn[column]
        return out


@dataclass(slots=True)
class SketchFigures:
    """What the run page reads of a sketch: per-rank stats, the flag rule's evidence, the heat map's cells."""

    stats: pd.DataFrame  # index rank: steps, median_s, p90_s, mean_s
    known_any: bool
    consistency: tuple[pd.DataFrame, float]  # (index rank: steps, slower_steps, median_excess; the yardstick)
    heat_mean: np.ndarray  # ranks x heat columns: mean compute, NaN where none


class RankSketch:
    """Fixed-size per-rank figures of the blocks added to it (module docstring)."""

    def __init__(self) -> None:
        self.ranks = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0, dtype=np.int64)
        self.total = np.zeros(0)
        self.low = np.zeros(0)
        self.high = np.zeros(0)
        self.compute = LogCounts(0, COMPUTE_GAMMA, TINY_SECONDS)
        self.compared = np.zeros(0, dtype=np.int64)
        self.slower = np.zeros(0, dtype=np.int64)
        self.excess = LogCounts(0, EXCESS_GAMMA, TINY_EXCESS)
        self.excess_low = np.zeros(0)
        self.excess_high = np.zeros(0)
        self.known = LogCounts(1, COMPUTE_GAMMA, TINY_SECONDS)  # every known value, one row: the yardstick
        self.known_low, self.known_high = math.inf, -math.inf
        self.chunk_steps = 1
        self.heat_total: dict[int, np.ndarray] = {}  # chunk (step // chunk_steps) -> per rank: sum of compute
        self.heat_count: dict[int, np.ndarray] = {}  # -> per rank: values

    @property
    def nbytes(self) -> int:
        heat = sum(v.nbytes for v in self.heat_total.values()) + sum(v.nbytes for v in self.heat_count.values())
        return int(self.compute.nbytes + self.excess.nbytes + self.known.nbytes + heat + 8 * 8 * len(self.ranks))

    def copy(self) -> RankSketch:
        out = RankSketch.__new__(RankSketch)
        for name in ("ranks", "count", "total", "low", "high", "compared", "slower", "excess_low", "excess_high"):
            setattr(out, name, getattr(self, name).copy())
        out.compute, out.excess, out.known = self.compute.copy(), self.excess.copy(), self.known.copy()
        out.known_low, out.known_high, out.chunk_steps = self.known_low, self.known_high, self.chunk_steps
        out.heat_total = {k: v.copy() for k, v in self.heat_total.items()}
        out.heat_count = {k: v.copy() for k, v in self.heat_count.items()}
        return out

    def add_block(self, block: StepBlock) -> None:
        rows = self._rows_of(block.ranks)
        compute = block.compute  # ranks x steps, NaN where a rank sent no row
        present = ~np.isnan(compute)
        dense = bool(present.all())
        filled = compute if dense else np.where(present, compute, 0.0)
        self.count[rows] += present.sum(axis=1)
        self.total[rows] += filled.sum(axis=1)
        self.low[rows] = np.fmin(self.low[rows], np.fmin.reduce(compute, axis=1))  # fmin skips NaN
        self.high[rows] = np.fmax(self.high[rows], np.fmax.reduce(compute, axis=1))
        row = np.repeat(rows, compute.shape[1])
        values = compute.reshape(-1)
        if not dense:
            kept = present.reshape(-1)
            row, values = row[kept], values[kept]
        bins = self.compute.bins(values)
        self.compute.add(row, values, bins)
        every_value_known = dense and block.excess is not None and bool(block.known_columns.all())
        self._add_excess(block, rows, bins if every_value_known else None)
        self._add_heat(block, rows, present, filled)

    def _rows_of(self, ranks: np.ndarray) -> np.ndarray:
        if not np.isin(ranks, self.ranks, assume_unique=True).all():
            union = np.union1d(self.ranks, ranks)
            at = np.searchsorted(union, self.ranks)
            n = len(union)
            for name, fill in (("count", 0), ("total", 0.0), ("low", np.inf), ("high", -np.inf), ("compared", 0),
                               ("slower", 0), ("excess_low", np.inf), ("excess_high", -np.inf)):
                old = getattr(self, name)
                new = np.full(n, fill, dtype=old.dtype)
                new[at] = old
                setattr(self, name, new)
            self.compute.grow_rows(n, at)
            self.excess.grow_rows(n, at)
            for table in (self.heat_total, self.heat_count):
                for key, old in table.items():
                    new = np.zeros(n, dtype=old.dtype)
                    new[at] = old
                    table[key] = new
            self.ranks = union
        found: np.ndarray = np.searchsorted(self.ranks, ranks)
        return found

    def _add_excess(self, block: StepBlock, rows: np.ndarray,
                    compute_bins: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Each known value minus the median of the other known values of its step (stragglers.rank_consistency);
        `compute_bins`: the bins of every compute value of the block, when every one of them is known."""
        if block.excess is not None:  # the usual shape: computed when the block was made
            excess = block.excess.reshape(-1)
            row = np.repeat(rows, block.excess.shape[1])
            known_values = block.compute[:, block.known_columns].reshape(-1)
        else:
            r, c = np.nonzero(block.known)
            known_values = block.compute[r, c]
            excess = known_values - others_median(c, known_values)
            row = rows[r]
        if len(known_values):
            self.known.add(np.zeros(len(known_values), dtype=np.int64), known_values, compute_bins)
            self.known_low = min(self.known_low, float(known_values.min()))
            self.known_high = max(self.known_high, float(known_values.max()))
        compared = ~np.isnan(excess)
        if not compared.all():
            row, excess = row[compared], excess[compared]
        if not len(row):
            return
        self.compared += np.bincount(row, minlength=len(self.ranks))
        self.slower += np.bincount(row[excess > 0], minlength=len(self.ranks))
        if block.excess is not None:  # a matrix without NaN: per-row extremes
            self.excess_low[rows] = np.minimum(self.excess_low[rows], block.excess.min(axis=1))
            self.excess_high[rows] = np.maximum(self.excess_high[rows], block.excess.max(axis=1))
        else:
            np.fmin.at(self.excess_low, row, excess)
            np.fmax.at(self.excess_high, row, excess)
        self.excess.add(row, excess)

    def _add_heat(self, block: StepBlock, rows: np.ndarray, present: np.ndarray, filled: np.ndarray) -> None:
        chunk = block.steps // self.chunk_steps  # ascending: each chunk is a run of columns
        starts = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
        sums = np.add.reduceat(filled, starts, axis=1)
        counts = np.add.reduceat(present, starts, axis=1, dtype=np.int64)
        for i, key in enumerate(chunk[starts].tolist()):
            total = self.heat_total.setdefault(key, np.zeros(len(self.ranks), dtype=np.float32))
            count = self.heat_count.setdefault(key, np.zeros(len(self.ranks), dtype=np.float32))
            total[rows] += sums[:, i]
            count[rows] += counts[:, i]
        while max(self.heat_total) - min(self.heat_total) + 1 > HEAT_CHUNKS:
            self._double_chunks()

    def _double_chunks(self) -> None:
        self.chunk_steps *= 2
        for table in (self.heat_total, self.heat_count):
            merged: dict[int, np.ndarray] = {}
            for key, values in table.items():
                if key // 2 in merged:
                    merged[key // 2] = merged[key // 2] + values
                else:
                    merged[key // 2] = values
            table.clear()
            table.update(merged)

    def figures(self, col_edges: np.ndarray) -> SketchFigures:
        index = pd.Index(self.ranks, name="rank")
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self.total / self.count
        stats = pd.DataFrame({"steps": self.count, "median_s": self.compute.quantile(0.5, self.low, self.high),
                              "p90_s": self.compute.quantile(0.9, self.low, self.high), "mean_s": mean}, index=index)
        compared = self.compared > 0
        by_rank = pd.DataFrame({
            "steps": self.compared[compared], "slower_steps": self.slower[compared],
            "median_excess": self.excess.quantile(0.5, self.excess_low, self.excess_high)[compared],
        }, index=pd.Index(self.ranks[compared], name="rank"))
        reference = self.known.quantile(0.5, np.array([self.known_low]), np.array([self.known_high]))[0]
        known_any = bool(self.known.zero.sum() + self.known.pos.sum() > 0)
        return SketchFigures(stats=stats, known_any=known_any,
                             consistency=(by_rank, float(reference) if known_any else 0.0),
                             heat_mean=self._heat_mean(col_edges))

    def _heat_mean(self, col_edges: np.ndarray) -> np.ndarray:
        n_cols = len(col_edges) - 1
        total = np.zeros((len(self.ranks), n_cols))
        count = np.zeros((len(self.ranks), n_cols))
        for key, sums in self.heat_total.items():
            middle = (key + 0.5) * self.chunk_steps - 0.5
            col = int(np.clip(np.searchsorted(col_edges, middle, side="right") - 1, 0, n_cols - 1))
            total[:, col] += sums
            count[:, col] += self.heat_count[key]
        with np.errstate(invalid="ignore", divide="ignore"):
            out: np.ndarray = total / count
        return out
