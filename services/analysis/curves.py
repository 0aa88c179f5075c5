"""Training curves for the run page: loss, learning rate and step time over time (GET /v1/runs/{run_id}/curves).

Pure: the run's job steps with their loss and lr (one row per attempt and step: `attempt, step, start, end, loss,
lr`; storage reduces the ranks' rows in the database) and the run's views (for the restart and checkpoint marks) in,
`TrainingCurves` out. Bounded whatever the run's length: each metric keeps at most `max_points` points over all of
its attempts, shared by the attempts in proportion to their steps; within an attempt the steps are cut into equal
buckets and each bucket keeps its lowest and its highest value (in step order), so a loss spike or a slow step is
never averaged away.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from services.schemas.views import CurveMark, CurveSeries, RunViews, TrainingCurves

MAX_POINTS = 2000
CURVE_COLUMNS = ("attempt", "step", "start", "end", "loss", "lr")


def build_training_curves(job_steps: pd.DataFrame, views: RunViews, *, max_points: int = MAX_POINTS) -> TrainingCurves:
    if max_points < 8:
        raise ValueError(f"max_points must be at least 8, got {max_points}")
    ordered = job_steps.sort_values(["attempt", "step"], kind="stable")
    metrics = {"loss": ordered["loss"].to_numpy(np.float64), "lr": ordered["lr"].to_numpy(np.float64),
               "step_seconds": (ordered["end"] - ordered["start"]).to_numpy(np.float64)}
    attempt = ordered["attempt"].to_numpy(np.int64)
    step = ordered["step"].to_numpy(np.int64)
    end = ordered["end"].to_numpy(np.float64)
    series: dict[str, list[CurveSeries]] = {}
    downsampled = False
    for name, values in metrics.items():
        known = ~np.isnan(values)
        series[name], cut = _series(attempt[known], step[known], end[known], values[known], max_points)
        downsampled = downsampled or cut
    restarts = [CurveMark(time=r.time, step=r.resume_step, label=f"restart: attempt {r.attempt}")
                for r in views.timeline.restarts]
    checkpoints = [CurveMark(time=c.end, step=c.step, label=f"checkpoint at step {c.step:,}")
                   for c in views.checkpoints if c.ok]
    return TrainingCurves(run_id=views.run_id, loss=series["loss"], lr=series["lr"],
                          step_seconds=series["step_seconds"], restarts=restarts, checkpoints=checkpoints,
                          max_points=max_points, downsampled=downsampled)


def _series(attempt: np.ndarray, step: np.ndarray, end: np.ndarray, values: np.ndarray,
            max_points: int) -> tuple[list[CurveSeries], bool]:
    """One series per attempt, at most `max_points` points in all; whether any was cut."""
    if len(values) == 0:
        return [], False
    numbers, counts = np.unique(attempt, return_counts=True)
    budgets = _share(counts, max_points)
    out = []
    for number, budget in zip(numbers.tolist(), budgets.tolist(), strict=True):
        if budget == 0:
            continue
        mine = np.flatnonzero(attempt == number)
        keep = mine[min_max_indices(values[mine], budget)]
        out.append(CurveSeries(attempt=int(number), time=end[keep].tolist(), step=step[keep].tolist(),
                               value=values[keep].tolist(), points_total=len(mine)))
    return out, bool((counts > budgets).any())


def _share(counts: np.ndarray, max_points: int) -> np.ndarray:
    """Each attempt's points: in proportion to its steps, at least 2 (its first and last), never more than it has,
    at most `max_points` in all (of more than max_points / 2 attempts, only the latest are drawn)."""
    total = int(counts.sum())
    if total <= max_points:
        return counts.copy()
    floor = np.minimum(counts, 2)
    floor[: max(len(counts) - max_points // 2, 0)] = 0
    counts = np.where(np.arange(len(counts)) < len(counts) - max_points // 2, 0, counts)
    spare = max(max_points - int(floor.sum()), 0)
    extra = np.floor((counts - floor) * spare / max(total - int(floor.sum()), 1)).astype(np.int64)
    shared: np.ndarray = np.minimum(counts, floor + extra)
    return shared


def min_max_indices(values: np.ndarray, budget: int) -> np.ndarray:
    """Positions of at most `budget` points of `values` (in order) keeping each equal bucket's lowest and highest
    value, and the first and last point."""
    n = len(values)
    if n <= budget:
        return np.arange(n)
    if budget < 4:
        return np.unique(np.array([0, n - 1]))[:budget]
    buckets = (budget - 2) // 2
    edges = np.linspace(1, n - 1, buckets + 1).astype(np.int64)
    picked = [0, n - 1]
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        if hi > lo:
            chunk = values[lo:hi]
            picked += [lo + int(np.argmin(chunk)), lo + int(np.argmax(chunk))]
    return np.unique(np.array(picked, dtype=np.int64))
