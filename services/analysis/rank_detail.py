"""One rank of a run, for the run page's drill-down (GET /v1/runs/{run_id}/ranks/{rank}): its host, the attempts it
was part of, its steps' compute and collective time over the run, and the failures of the attempts it was in.

Pure: the rank's own step rows and control events come in as frames, the run's views (which already know the run's
failures and every rank's compute figures) as their model.

Rules:
- A step's collective time is its reported `comm` (seconds inside collectives); where a step reported none, the
  seconds of its collective calls (`comm` frame, summed per step); else unknown. Compute is the step's duration
  minus its collective time, or the whole duration when that is unknown (`compute_source` says which).
- A rank was part of an attempt when it sent that attempt's `attempt_start`, `attempt_end` or a step of it.
- A failure is the run's (the views' `timeline.failures`, one per failed attempt); the rank was part of it when it
  was part of that attempt. `reported_failure` says whether the rank's own `attempt_end` said "failed";
  `steps_behind` is the failure's step minus the rank's last step in that attempt (a rank that stopped before
  the others, as a hung rank does, is behind).
- More than `max_points` steps are shown as consecutive buckets of equal count: each bucket's last step and end
  time, its mean compute and mean collective time (`steps_per_point` says how many).
- Its times are on the run's reference clock, as the ledger's: taken back by its host's clock offset
  (`clock_offset_seconds`, the views' `ranks.clocks`; services.analysis.clocks).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from services.analysis.collective_time import step_collective_seconds
from services.analysis.run_data import ranks_own
from services.schemas.ranks import RankAttempt, RankDetail, RankFailure, RankSteps
from services.schemas.views import RankRow, RunViews

MAX_POINTS = 2000


def build_rank_detail(views: RunViews, rank: int, steps: pd.DataFrame, comm: pd.DataFrame, events: pd.DataFrame,
                      *, max_points: int = MAX_POINTS) -> RankDetail:
    """`steps`: the rank's step rows (attempt, step, start, end, comm: NaN when not reported); `comm`: its collective
    seconds per (attempt, step) (COMM_COLUMNS; rank ignored); `events`: its control events (kind, time, attempt,
    host, reason, world_size)."""
    rows = views.ranks.rows
    row = next((r for r in rows if r.rank == rank), None)
    host = _host(events, row)
    clocks = {c.host: c.offset_seconds for c in getattr(views.ranks, "clocks", [])}
    offset = clocks.get(host) if host is not None else None
    if offset:
        steps = steps.assign(start=steps["start"] - offset, end=steps["end"] - offset)
        events = events.assign(time=events["time"] - offset)
    steps = steps.sort_values(["attempt", "step"], kind="stable").reset_index(drop=True)
    collective = step_collective_seconds(steps, comm)
    duration = (steps["end"] - steps["start"]).to_numpy(dtype=np.float64)
    known_comm = np.isfinite(collective)
    compute = np.where(known_comm, np.maximum(duration - np.nan_to_num(collective), 0.0), duration)
    attempts = _attempts(steps, events, compute, collective, views)
    part_of = {a.attempt: a for a in attempts}  # the attempts this rank was part of
    failures = [_failure(f.attempt, f.time, f.step, f.reason, part_of[f.attempt], events)
                for f in views.timeline.failures if f.attempt in part_of]
    world = events["world_size"].dropna() if "world_size" in events else pd.Series(dtype="float64")
    return RankDetail(
        run_id=views.run_id, rank=rank, known=bool(len(steps) or len(events)), host=host,
        host_ranks=sorted({r.rank for r in rows if host is not None and r.host == host} | {rank}),
        world_size=int(world.iloc[-1]) if len(world) else None, row=row, clock_offset_seconds=offset,
        run_median_compute_s=getattr(views.ranks, "median_compute_s", None),
        compute_source="step duration minus collectives" if known_comm.any() else "step duration",
        attempts=attempts, failures=failures,
        steps=_series(steps, compute, collective, max_points), version=views.version)


def _host(events: pd.DataFrame, row: RankRow | None) -> str | None:
    hosts = events["host"].dropna() if "host" in events else pd.Series(dtype=object)
    if len(hosts):
        return str(hosts.iloc[-1])
    return row.host if row is not None else None


def _median(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else None


def _attempts(steps: pd.DataFrame, events: pd.DataFrame, compute: np.ndarray, collective: np.ndarray,
              views: RunViews) -> list[RankAttempt]:
    failed = {f.attempt for f in views.timeline.failures} | {a.attempt for a in views.timeline.attempts if a.failed}
    numbers = sorted({int(a) for a in steps["attempt"]} | {int(a) for a in events["attempt"].dropna()})
    out = []
    for n in numbers:
        mine = (steps["attempt"] == n).to_numpy()
        ev = ranks_own(events[events["attempt"] == n])
        started = ev[ev["kind"] == "attempt_start"]
        ended = ev[ev["kind"] == "attempt_end"]
        hosts = started["host"].dropna()
        first_start = float(steps["start"][mine].min()) if mine.any() else None
        last_end = float(steps["end"][mine].max()) if mine.any() else None
        out.append(RankAttempt(
            attempt=n, host=str(hosts.iloc[-1]) if len(hosts) else None,
            start=float(started["time"].min()) if len(started) else first_start,
            end=float(ended["time"].max()) if len(ended) else last_end,
            reason=str(ended["reason"].iloc[-1]) if len(ended) and ended["reason"].iloc[-1] is not None else None,
            failed=n in failed, steps=int(mine.sum()),
            first_step=int(steps["step"][mine].min()) if mine.any() else None,
            last_step=int(steps["step"][mine].max()) if mine.any() else None,
            median_compute_s=_median(compute[mine]), median_collective_s=_median(collective[mine])))
    return out


def _failure(attempt: int, time: float, step: int | None, reason: str, mine: RankAttempt,
             events: pd.DataFrame) -> RankFailure:
    ended = ranks_own(events[(events["attempt"] == attempt) & (events["kind"] == "attempt_end")])
    reported = bool((ended["reason"] == "failed").any())
    behind = None if step is None or mine.last_step is None else int(step) - mine.last_step
    return RankFailure(attempt=attempt, time=time, step=step, reason=reason, reported_failure=reported,
                       rank_last_step=mine.last_step, steps_behind=behind)


def _series(steps: pd.DataFrame, compute: np.ndarray, collective: np.ndarray, max_points: int) -> RankSteps:
    n = len(steps)
    per = max(1, -(-n // max_points))
    if per == 1:
        return RankSteps(attempt=steps["attempt"].astype(int).tolist(), step=steps["step"].astype(int).tolist(),
                         end=steps["end"].astype(float).tolist(), compute_s=compute.tolist(),
                         collective_s=[None if not np.isfinite(v) else float(v) for v in collective],
                         steps_total=n, steps_per_point=1)
    last = np.minimum(np.arange(per - 1, n + per - 1, per), n - 1)
    starts = np.arange(0, n, per)
    counts = np.diff(np.append(starts, n))
    mean_compute = np.add.reduceat(compute, starts) / counts
    known = np.isfinite(collective)
    known_n = np.add.reduceat(known.astype(np.int64), starts)
    sums = np.add.reduceat(np.where(known, collective, 0.0), starts)
    mean_collective = [float(s / k) if k else None for s, k in zip(sums, known_n, strict=True)]
    return RankSteps(attempt=steps["attempt"].to_numpy()[last].astype(int).tolist(),
                     step=steps["step"].to_numpy()[last].astype(int).tolist(),
                     end=steps["end"].to_numpy()[last].astype(float).tolist(),
                     compute_s=mean_compute.astype(float).tolist(), collective_s=mean_collective,
                     steps_total=n, steps_per_point=per)
