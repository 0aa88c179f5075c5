"""A run's step rows reduced per block of steps: what the ledger and the run page read instead of every row.

A block is the rows of one attempt whose step lies in [block x BLOCK_STEPS, (block + 1) x BLOCK_STEPS): every rank's
rows of those steps, so whatever the analysis needs per (attempt, step) is computed inside one block. Its summary
(`StepBlock`) holds, after the same dedupe as `attempts.dedupe_steps` (one row per (attempt, rank, step), the
earliest (start, end) wins):

- per step: the job step (first start, last end, ranks reporting) and the straggle statistics over the ranks whose
  collective time is known (slowest compute, median compute, the slowest rank: the lowest of equals, ranks known);
- the ranks of the block, the earliest start and the latest end of its raw rows (duplicates included, as
  `attempts.first_time` / `latest_time` read them);
- per (rank, step) the compute seconds and whether the collective time is known, as a ranks x steps matrix (NaN
  where a rank sent no row): the run page's per-rank statistics, flags and heat map;
- its ranks in clock groups (services.analysis.block_clocks): per group, each step's first start and last end, so
  that the job steps can be taken with hosts' clock offsets taken out (services.analysis.clocks).

services.analysis.step_summary puts the blocks of a run together as a `StepSummary`. A block's summary depends
only on its rows, so a block is summarised again only when rows arrive for it (services.storage.step_blocks keeps
them), and the merge of all blocks equals the summary of the whole run: the analysis built on it equals the one
built on every row (tests/storage/test_incremental_analysis.py compares them). A block whose rows retention
deleted keeps their summary, and rows received since are summarised onto it (`extend_block`: the summary of all of
them, a repeat of a deleted (rank, step) counting as the deleted row).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from services.analysis.block_clocks import BlockClocks, block_clocks, one_clock
from services.analysis.collective_time import step_collective_seconds
from services.analysis.medians import others_median_by_step

BLOCK_STEPS = 128

_JOB = ("step", "start", "end", "ranks")
STRAGGLE_COLUMNS = ("slowest", "median", "rank", "known")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepBlock:
    attempt: int
    block: int
    steps: np.ndarray  # int64, the block's step numbers that have rows, ascending
    start: np.ndarray  # float64 per step: first rank's start
    end: np.ndarray  # float64 per step: last rank's end
    ranks_per_step: np.ndarray  # int64 per step: ranks that reported it
    slowest: np.ndarray  # float64 per step: the slowest known compute (NaN: no rank known)
    median: np.ndarray  # float64 per step: the median known compute
    slowest_rank: np.ndarray  # int64 per step: the rank with the slowest known compute, lowest of equals (-1: none)
    known_ranks: np.ndarray  # int64 per step: ranks whose compute is known
    ranks: np.ndarray  # int64, the block's ranks, ascending
    compute: np.ndarray  # float64 ranks x steps: compute seconds, NaN where the rank has no row for the step
    known: np.ndarray  # bool ranks x steps: the row's collective time is known
    raw_first_start: float
    raw_last_end: float
    clocks: BlockClocks
    # derived from the above when the block is made (not stored): the columns (steps) where some rank's collective
    # time is known, and, when every rank of the block is known in each of them (the usual shape), each rank's
    # compute minus the median of the other ranks' in those steps (ranks x known steps), the flag rule's evidence
    # (stragglers.consistency_of_grid) computed once per block instead of once per build
    known_columns: np.ndarray = field(init=False, repr=False, compare=False)
    excess: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        columns = self.known.any(axis=0) if self.known.size else np.zeros(len(self.steps), dtype=bool)
        object.__setattr__(self, "known_columns", columns)
        excess = None
        if len(self.ranks) >= 2 and bool(self.known[:, columns].all()):
            values = self.compute[:, columns]
            excess = values - others_median_by_step(values.T).T
        object.__setattr__(self, "excess", excess)

    @property
    def nbytes(self) -> int:
        return int(self.compute.nbytes + self.known.nbytes + (self.excess.nbytes if self.excess is not None else 0)
                   + 8 * 8 * len(self.steps) + self.clocks.nbytes)

    def per_step(self) -> BlockSteps:
        """The block without its per-(rank, step) matrices: what the ledger reads of it."""
        return BlockSteps(attempt=self.attempt, block=self.block, steps=self.steps, start=self.start, end=self.end,
                          ranks_per_step=self.ranks_per_step, slowest=self.slowest, median=self.median,
                          slowest_rank=self.slowest_rank, known_ranks=self.known_ranks, ranks=self.ranks,
                          values=int(self.compute.size), raw_first_start=self.raw_first_start,
                          raw_last_end=self.raw_last_end, clocks=self.clocks)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockSteps:
    """A block's per-step figures (the fields of `StepBlock` of the same names), kept for a block whose
    per-(rank, step) values went into a `RankSketch`."""

    attempt: int
    block: int
    steps: np.ndarray
    start: np.ndarray
    end: np.ndarray
    ranks_per_step: np.ndarray
    slowest: np.ndarray
    median: np.ndarray
    slowest_rank: np.ndarray
    known_ranks: np.ndarray
    ranks: np.ndarray
    values: int  # the block's (rank, step) cells
    raw_first_start: float
    raw_last_end: float
    clocks: BlockClocks

    @property
    def nbytes(self) -> int:
        return int(8 * 8 * len(self.steps) + self.ranks.nbytes + self.clocks.nbytes)


def block_of(step: np.ndarray | int) -> np.ndarray:
    return np.floor_divide(np.asarray(step, dtype=np.int64), BLOCK_STEPS)


def summarize_block(attempt: int, block: int, rank: np.ndarray, step: np.ndarray, start: np.ndarray,
                    end: np.ndarray, comm: np.ndarray) -> StepBlock:
    """One block's rows (any order, duplicates included; `comm`: the row's collective seconds, its own or summed
    from its collective rows, NaN where unknown) -> its summary."""
    rank, step = np.asarray(rank, dtype=np.int64), np.asarray(step, dtype=np.int64)
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    comm = np.asarray(comm, dtype=np.float64)
    raw_first, raw_last = float(start.min()), float(end.max())
    raw_rank, raw_start, raw_end = rank, start, end
    # dedupe as attempts.dedupe_steps: by (rank, step, start, end), the first of each (rank, step)
    order = np.lexsort((end, start, step, rank))
    rank, step, start, end, comm = rank[order], step[order], start[order], end[order], comm[order]
    first = np.ones(len(step), dtype=bool)
    first[1:] = (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
    rank, step, start, end, comm = rank[first], step[first], start[first], end[first], comm[first]

    ranks, row = np.unique(rank, return_inverse=True)
    steps, col = np.unique(step, return_inverse=True)
    known_row = ~np.isnan(comm)
    compute_row = np.clip((end - start) - np.where(known_row, comm, 0.0), 0.0, None)  # stragglers.step_compute
    compute = np.full((len(ranks), len(steps)), np.nan)
    compute[row, col] = compute_row
    known = np.zeros((len(ranks), len(steps)), dtype=bool)
    known[row, col] = known_row

    first_start = np.full(len(steps), np.inf)
    np.minimum.at(first_start, col, start)
    last_end = np.full(len(steps), -np.inf)
    np.maximum.at(last_end, col, end)
    ranks_per_step = np.bincount(col, minlength=len(steps)).astype(np.int64)
    clocks = block_clocks(attempt, block, ranks, row, steps, col, start, end, np.searchsorted(ranks, raw_rank),
                          raw_start, raw_end, first_start, last_end)
    return _block(attempt, block, steps, first_start, last_end, ranks_per_step, ranks, compute, known, raw_first,
                  raw_last, clocks)


def _block(attempt: int, block: int, steps: np.ndarray, start: np.ndarray, end: np.ndarray,
           ranks_per_step: np.ndarray, ranks: np.ndarray, compute: np.ndarray, known: np.ndarray, raw_first: float,
           raw_last: float, clocks: BlockClocks) -> StepBlock:
    """The block of these per-step and per-(rank, step) figures, with the straggle statistics computed from them."""
    known_values = np.where(known, compute, np.nan)
    known_ranks = known.sum(axis=0).astype(np.int64)
    has = known_ranks > 0
    slowest = np.full(len(steps), np.nan)
    median = np.full(len(steps), np.nan)
    slowest_rank = np.full(len(steps), -1, dtype=np.int64)
    if has.any():
        sub = known_values[:, has]  # every column has a known value: no all-NaN slice to warn about
        slowest[has] = np.nanmax(sub, axis=0)
        median[has] = np.nanmedian(sub, axis=0)
        slowest_rank[has] = ranks[np.nanargmax(sub, axis=0)]  # the first maximum: the lowest of equal ranks
    return StepBlock(attempt=int(attempt), block=int(block), steps=steps, start=start, end=end,
                     ranks_per_step=ranks_per_step, slowest=slowest, median=median, slowest_rank=slowest_rank,
                     known_ranks=known_ranks, ranks=ranks, compute=compute, known=known,
                     raw_first_start=raw_first, raw_last_end=raw_last, clocks=clocks)


def holds(block: StepBlock, rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Per (rank, step) pair: whether the block has a row of that rank for that step."""
    rank, step = np.asarray(rank, dtype=np.int64), np.asarray(step, dtype=np.int64)
    if not len(block.ranks) or not len(block.steps):
        return np.zeros(len(rank), dtype=bool)
    row = np.clip(np.searchsorted(block.ranks, rank), 0, len(block.ranks) - 1)
    col = np.clip(np.searchsorted(block.steps, step), 0, len(block.steps) - 1)
    held: np.ndarray = (block.ranks[row] == rank) & (block.steps[col] == step) & ~np.isnan(block.compute[row, col])
    return held


def extend_block(base: StepBlock | None, attempt: int, block: int, rank: np.ndarray, step: np.ndarray,
                 start: np.ndarray, end: np.ndarray, comm: np.ndarray) -> StepBlock | None:
    """A pruned block's summary with the rows received since its rows were deleted (`base`: their summary; the
    arguments as `summarize_block`'s). A row of a (rank, step) the base holds repeats a deleted one, which counts
    (as the earliest would: a resend carries the same times); the others are summarised as usual and join the
    base's. Without repeats, equal to the summary of the deleted rows and these together."""
    if not len(step):
        return base
    if base is None:
        return summarize_block(attempt, block, rank, step, start, end, comm)
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    raw_first, raw_last = min(base.raw_first_start, float(start.min())), max(base.raw_last_end, float(end.max()))
    new = ~holds(base, rank, step)
    if not new.any():
        return replace(base, raw_first_start=raw_first, raw_last_end=raw_last)
    added = summarize_block(attempt, block, np.asarray(rank)[new], np.asarray(step)[new], start[new], end[new],
                            np.asarray(comm, dtype=np.float64)[new])
    ranks, steps = np.union1d(base.ranks, added.ranks), np.union1d(base.steps, added.steps)
    compute = np.full((len(ranks), len(steps)), np.nan)
    known = np.zeros((len(ranks), len(steps)), dtype=bool)
    first_start = np.full(len(steps), np.inf)
    last_end = np.full(len(steps), -np.inf)
    ranks_per_step = np.zeros(len(steps), dtype=np.int64)
    for part in (base, added):  # their (rank, step) cells are disjoint: the added ones were not held
        rows, cols = np.searchsorted(ranks, part.ranks), np.searchsorted(steps, part.steps)
        cells = np.ix_(rows, cols)
        has = ~np.isnan(part.compute)
        compute[cells] = np.where(has, part.compute, compute[cells])
        known[cells] = np.where(has, part.known, known[cells])
        first_start[cols] = np.minimum(first_start[cols], part.start)
        last_end[cols] = np.maximum(last_end[cols], part.end)
        ranks_per_step[cols] += part.ranks_per_step
    # The deleted rows' step ends are gone: the extended block is taken as one clock (docs/retention.md, "Limits")
    clocks = one_clock(attempt, block, ranks, steps, first_start, last_end, raw_first, raw_last)
    return _block(attempt, block, steps, first_start, last_end, ranks_per_step, ranks, compute, known, raw_first,
                  raw_last, clocks)


def summarize_steps(steps: pd.DataFrame, comm: pd.DataFrame | None = None) -> list[StepBlock]:
    """Every block of a run's step rows (STEP_COLUMNS; `comm`: COMM_COLUMNS, collective seconds summed per
    (attempt, rank, step), filling the rows whose own `comm` is NaN)."""
    if steps.empty:
        return []
    own = step_collective_seconds(steps, comm)
    attempt = steps["attempt"].to_numpy(np.int64)
    step = steps["step"].to_numpy(np.int64)
    block = block_of(step)
    order = np.lexsort((block, attempt))
    key_a, key_b = attempt[order], block[order]
    cut = np.flatnonzero(np.r_[True, (key_a[1:] != key_a[:-1]) | (key_b[1:] != key_b[:-1]), True])
    rank, start, end = (steps[c].to_numpy(dtype) for c, dtype in (("rank", np.int64), ("start", np.float64),
                                                                  ("end", np.float64)))
    out = []
    for lo, hi in itertools.pairwise(cut):
        sel = order[lo:hi]
        out.append(summarize_block(int(key_a[lo]), int(key_b[lo]), rank[sel], step[sel], start[sel], end[sel],
                                   own[sel]))
    return out
