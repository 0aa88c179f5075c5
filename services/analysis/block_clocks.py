"""A block's clock groups (services.analysis.clocks explains the rule): ranks whose step ends line up within
TOLERANCE_S share a clock; per group, each step's first start and last end, so that the job step's span can be
taken once each group's offset is known."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockClocks:
    """One block's ranks in clock groups: per group its deviation from the block's anchor rank (NaN: the ranks
    whose step ends do not keep time with it) and, per step, its first start and last end."""

    attempt: int
    block: int
    ranks: np.ndarray  # int64, the block's ranks, ascending
    group: np.ndarray  # int32 per rank: its clock group
    deviation: np.ndarray  # float64 per group: median step end minus the anchor's (NaN: no evidence)
    steps: np.ndarray  # int64, the block's steps, ascending
    start: np.ndarray  # float64 groups x steps: the group's first start (NaN: none of its ranks reported the step)
    end: np.ndarray  # float64 groups x steps: its last end
    raw_first_start: np.ndarray  # float64 per group: its rows' earliest start, duplicates included
    raw_last_end: np.ndarray  # float64 per group: their latest end

    @property
    def nbytes(self) -> int:
        spans = self.start.nbytes + self.end.nbytes if len(self.deviation) > 1 else 0  # one group: the block's own
        return int(self.group.nbytes + self.deviation.nbytes + spans + self.raw_first_start.nbytes
                   + self.raw_last_end.nbytes)


TOLERANCE_S = 0.05  # step ends within this of each other are one clock; a larger offset is corrected
ABSURD_S = 60.0  # an offset this large is a clock's, whatever hosts the ranks name


def block_clocks(attempt: int, block: int, ranks: np.ndarray, row: np.ndarray, steps: np.ndarray, col: np.ndarray,
                 start: np.ndarray, end: np.ndarray, raw_row: np.ndarray, raw_start: np.ndarray,
                 raw_end: np.ndarray, block_start: np.ndarray | None = None,
                 block_end: np.ndarray | None = None) -> BlockClocks:
    """One block's clock groups. `ranks`, `steps`: the block's, ascending; `row`, `col`, `start`, `end`: its rows
    deduped (one per (rank, step)), `row`/`col` their index in `ranks`/`steps`; `raw_*`: every row (duplicates
    included), `raw_row` its index in `ranks`; `block_start`/`block_end`: each step's first start and last end over
    all ranks when the caller has them (a block of one clock shares them instead of a copy)."""
    group, deviation = _groups(len(ranks), row, col, end, len(steps))
    n = len(deviation)
    if n == 1 and block_start is not None and block_end is not None:  # one clock: the block's own spans, shared
        return BlockClocks(attempt=int(attempt), block=int(block), ranks=ranks, group=group, deviation=deviation,
                           steps=steps, start=block_start[None, :], end=block_end[None, :],
                           raw_first_start=np.array([np.min(raw_start)]), raw_last_end=np.array([np.max(raw_end)]))
    first = _per_group(np.minimum, np.inf, group, n, row, col, start, len(steps))
    last = _per_group(np.maximum, -np.inf, group, n, row, col, end, len(steps))
    raw_group = group[raw_row]
    raw_first = np.array([np.min(raw_start[raw_group == g], initial=np.inf) for g in range(n)])
    raw_last = np.array([np.max(raw_end[raw_group == g], initial=-np.inf) for g in range(n)])
    return BlockClocks(attempt=int(attempt), block=int(block), ranks=ranks, group=group, deviation=deviation,
                       steps=steps, start=np.where(np.isinf(first), np.nan, first),
                       end=np.where(np.isinf(last), np.nan, last), raw_first_start=raw_first, raw_last_end=raw_last)


def _per_group(reduce: np.ufunc, fill: float, group: np.ndarray, n_groups: int, row: np.ndarray, col: np.ndarray,
               values: np.ndarray, n_steps: int) -> np.ndarray:
    """Per clock group and step, `reduce` (np.minimum / np.maximum) over the group's ranks' values (`fill` where none
    of them has a row): the rows (one per (rank, step)) put in a ranks x steps matrix, each group's rows of it reduced
    in rank order, as np.minimum.at would over the rows in that order, without its cost per value."""
    cells = np.full((len(group), n_steps), fill)
    cells[row, col] = values
    if n_groups == 1:
        out: np.ndarray = reduce.reduce(cells, axis=0)[None, :]
        return out
    return np.stack([reduce.reduce(cells[group == g], axis=0, initial=fill) for g in range(n_groups)])


def one_clock(attempt: int, block: int, ranks: np.ndarray, steps: np.ndarray, start: np.ndarray, end: np.ndarray,
              raw_first_start: float, raw_last_end: float) -> BlockClocks:
    """A block whose ranks are taken to share one clock (no evidence otherwise): one group, the block's spans."""
    return BlockClocks(attempt=int(attempt), block=int(block), ranks=ranks, group=np.zeros(len(ranks), dtype=np.int32),
                       deviation=np.zeros(1), steps=steps, start=start[None, :], end=end[None, :],
                       raw_first_start=np.array([raw_first_start]), raw_last_end=np.array([raw_last_end]))


def _groups(n_ranks: int, row: np.ndarray, col: np.ndarray, end: np.ndarray,
            n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(the clock group of each rank, each group's deviation from the anchor; NaN: the ranks without evidence)."""
    if n_ranks < 2:
        return np.zeros(n_ranks, dtype=np.int32), np.zeros(1)
    ends = np.full((n_ranks, n_steps), np.nan)
    ends[row, col] = end
    anchor = int(np.argmax(np.bincount(row, minlength=n_ranks)))  # the first maximum: the lowest of equal ranks
    diff = ends - ends[anchor]
    deviation = _median_of_rows(diff)
    spread = _median_of_rows(np.abs(diff - deviation[:, None]))
    usable = np.isfinite(deviation) & (spread <= TOLERANCE_S)
    members = np.flatnonzero(usable)
    members = members[np.argsort(deviation[members], kind="stable")]
    ordered = deviation[members]
    ids = np.cumsum(np.r_[True, np.diff(ordered) > TOLERANCE_S]) - 1
    group = np.full(n_ranks, int(ids[-1]) + 1, dtype=np.int32)
    group[members] = ids
    groups = [float(np.median(ordered[ids == g])) for g in range(int(ids[-1]) + 1)]
    if not usable.all():
        groups.append(np.nan)
    return group, np.array(groups)


def single_clock(attempt: int, block: int, ranks: np.ndarray, steps: np.ndarray, start: np.ndarray,
                 end: np.ndarray, raw_first_start: float, raw_last_end: float) -> BlockClocks:
    """A block's clocks when nothing is known of them (a block stored before they were): one group, the block's."""
    return BlockClocks(attempt=attempt, block=block, ranks=ranks, group=np.zeros(len(ranks), dtype=np.int32),
                       deviation=np.zeros(1), steps=steps, start=start[None, :], end=end[None, :],
                       raw_first_start=np.array([raw_first_start]), raw_last_end=np.array([raw_last_end]))




def _median_of_rows(values: np.ndarray) -> np.ndarray:
    """Each row's median over its non-NaN values (NaN for a row of none); np.median, several times faster, when no
    value is missing (every rank reported every step: the usual block)."""
    missing = np.isnan(values)
    if not missing.any():
        return np.asarray(np.median(values, axis=1), dtype=np.float64)
    out = np.full(len(values), np.nan)
    some = ~missing.all(axis=1)  # a rank that shares no step with the anchor: no evidence
    out[some] = np.nanmedian(values[some], axis=1)
    return out
