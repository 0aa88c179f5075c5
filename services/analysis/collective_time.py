"""A step's seconds inside collectives: the one rule, read by the ledger's straggler cost, the run page's per-rank
figures (step blocks) and a rank's drill-down.

- A step's own `comm` (the client summed its collectives) wins; where a step reported none, the sum of its
  collective calls fills it in; else it is unknown (NaN).
- The calls of one (attempt, rank, step) are summed once each: two calls with the same start are one call
  recorded twice (a spool replayed, a relay's resend under other event ids), whatever op they name. A rank runs
  its collectives one after another, so two calls of its own never start at the same instant; and time inside
  collectives is wall time, so even calls that did share a start would not count that time twice.

Pure numpy; no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def comm_frame(attempt: Any = (), rank: Any = (), step: Any = (), seconds: Any = ()) -> pd.DataFrame:
    """Seconds inside collectives per (attempt, rank, step): COMM_COLUMNS."""
    n = len(step)
    return pd.DataFrame({
        "attempt": np.asarray(attempt, dtype=np.int64).reshape(n),
        "rank": np.asarray(rank, dtype=np.int64).reshape(n),
        "step": np.asarray(step, dtype=np.int64).reshape(n),
        "seconds": np.asarray(seconds, dtype=np.float64).reshape(n),
    })


def sum_collective_seconds(attempt: np.ndarray, rank: np.ndarray, step: np.ndarray, start: np.ndarray,
                           end: np.ndarray) -> pd.DataFrame:
    """Seconds inside collectives per (attempt, rank, step) (comm_frame), each call once (module
    docstring). Done in numpy: a database GROUP BY over DISTINCT rows is several times slower on a million calls."""
    if len(step) == 0:
        return comm_frame()
    attempt, rank, step = (np.asarray(a, dtype=np.int64) for a in (attempt, rank, step))
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    order = np.lexsort((start, step, rank, attempt))
    attempt, rank, step, start, end = attempt[order], rank[order], step[order], start[order], end[order]
    same_group = (attempt[1:] == attempt[:-1]) & (rank[1:] == rank[:-1]) & (step[1:] == step[:-1])
    keep = np.ones(len(step), dtype=bool)
    keep[1:] = ~(same_group & (start[1:] == start[:-1]))
    attempt, rank, step, seconds = attempt[keep], rank[keep], step[keep], (end - start)[keep]
    first = np.ones(len(step), dtype=bool)
    first[1:] = (attempt[1:] != attempt[:-1]) | (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
    starts = np.flatnonzero(first)
    return comm_frame(attempt[starts], rank[starts], step[starts], np.add.reduceat(seconds, starts))


def calls_seconds(collectives: pd.DataFrame) -> pd.DataFrame:
    """`sum_collective_seconds` of a frame of collective calls (run_data.collectives_frame)."""
    return sum_collective_seconds(*(collectives[c].to_numpy() for c in ("attempt", "rank", "step", "start", "end")))


def step_collective_seconds(steps: pd.DataFrame, comm: pd.DataFrame | None) -> np.ndarray:
    """Per row of `steps` (attempt, step, comm, and rank unless they are all one rank's): its seconds inside
    collectives, its own `comm` else the sum of its calls in `comm` (comm_frame), else NaN."""
    own = steps["comm"].to_numpy(np.float64)
    if comm is None or comm.empty or not np.isnan(own).any():
        return own
    if "rank" in steps.columns:  # comm_frame has one row per (attempt, rank, step)
        keys = ["attempt", "rank", "step"]
        summed = comm.set_index(keys)["seconds"]
    else:
        keys = ["attempt", "step"]
        summed = comm.groupby(keys)["seconds"].sum()
    from_calls = summed.reindex(pd.MultiIndex.from_frame(steps[keys])).to_numpy(np.float64)
    return np.where(np.isnan(own), from_calls, own)
