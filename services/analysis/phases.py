"""Phases outside the steps, from `phase_start` / `phase_end` events (docs/events.md, "Phases").

- **eval** spans: per (attempt, step), from the first rank's `phase_start` to the last rank's `phase_end` (the ranks
  evaluate together; a phase named twice at one step, like a checkpoint written twice, is one span). A phase no
  rank ended produced nothing: it claims time only when the attempt stepped after it (its end was lost), up to that
  step's start; otherwise its time is left to the other rules (a failed attempt's hang, a running run's tail).
- **init_process_group** waits: an attempt that never stepped and whose `init_process_group` did not succeed on
  every rank that entered it (a rank still inside it, or its `phase_end` not ok) was waiting for peers from the
  latest entry on (the moment the last rank that came began to wait); docs/ledger.md says what that time is.

Pure: frames in, frames out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

EVAL = "eval"
INIT_PROCESS_GROUP = "init_process_group"
EVAL_COLUMNS = ("attempt", "step", "start", "end")


def eval_spans(events: pd.DataFrame, job_steps: pd.DataFrame) -> pd.DataFrame:
    """The job-level eval spans (EVAL_COLUMNS), one per (attempt, step), sorted."""
    rows = _phase_rows(events, EVAL)
    if rows.empty:
        return pd.DataFrame({c: pd.Series([], dtype=np.int64 if c in ("attempt", "step") else np.float64)
                             for c in EVAL_COLUMNS})
    rows = rows.assign(t_start=rows["time"].where(rows["kind"] == "phase_start"),
                       t_end=rows["time"].where(rows["kind"] == "phase_end"))
    out = rows.groupby(["attempt", "step"], sort=True).agg(start=("t_start", "min"), end=("t_end", "max"),
                                                           first_end=("t_end", "min")).reset_index()
    out["start"] = out["start"].fillna(out["first_end"])  # its start lost: from the first end
    open_ = out["end"].isna()
    if open_.any():
        out.loc[open_, "end"] = [_next_step_start(job_steps, int(a), float(s))
                                 for a, s in zip(out.loc[open_, "attempt"], out.loc[open_, "start"], strict=True)]
    out = out[out["end"].notna()]
    out = out.assign(end=np.maximum(out["end"].to_numpy(np.float64), out["start"].to_numpy(np.float64)))
    return out[list(EVAL_COLUMNS)].reset_index(drop=True)


def init_waits(events: pd.DataFrame) -> dict[int, float]:
    """Per attempt whose `init_process_group` did not succeed on every rank that entered it: the latest entry."""
    rows = _phase_rows(events, INIT_PROCESS_GROUP)
    if rows.empty:
        return {}
    rows = rows[rows["rank"].notna()]
    waiting: set[int] = set()
    for _, mine in rows.groupby(["attempt", "rank"], sort=True):
        starts = mine.loc[mine["kind"] == "phase_start", "time"]
        if starts.empty:
            continue
        ends = mine[(mine["kind"] == "phase_end") & (mine["time"] >= float(starts.max()))]
        if not ends["ok"].map(lambda v: v is True).any():  # still inside, or it raised
            waiting.add(int(mine["attempt"].to_numpy(np.int64)[0]))
    # The wait began when the last rank that came entered, whether or not that one got through.
    latest = rows[rows["kind"] == "phase_start"].groupby("attempt")["time"].max()
    return {attempt: float(latest[attempt]) for attempt in sorted(waiting)}


def _phase_rows(events: pd.DataFrame, name: str) -> pd.DataFrame:
    if "name" not in events.columns:
        return events.iloc[0:0]
    rows = events[events["kind"].isin(["phase_start", "phase_end"]) & (events["name"] == name)
                  & events["attempt"].notna() & events["step"].notna()]
    return rows.assign(attempt=rows["attempt"].astype(np.int64), step=rows["step"].astype(np.int64))


def _next_step_start(job_steps: pd.DataFrame, attempt: int, start: float) -> float:
    """The start of the attempt's first step after `start`, NaN when it never stepped again."""
    if job_steps.empty:
        return float("nan")
    later = job_steps[(job_steps["attempt"] == attempt) & (job_steps["start"] >= start)]
    return float(later["start"].min()) if not later.empty else float("nan")
