"""A run's job steps with their loss and learning rate, for the training curves (services.analysis.curves)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import Connection, func, select

from services.analysis.curves import CURVE_COLUMNS
from services.storage.step_columns import column_rows
from services.storage.tables import steps

_PARTS = ("attempt", "step", "start", "end", "loss_sum", "loss_count", "lr")


def load_curve_steps(conn: Connection, run_pk: int) -> pd.DataFrame:
    """One row per (attempt, step): the first rank's start, the last rank's end, the mean loss and the highest lr of
    the ranks that reported them (NaN: none did). The rows still in `steps` are reduced in the database; those of
    the blocks the ranks have left (`step_columns`) are decoded and reduced here; a step with rows in both (a late
    row) is reduced over all of them."""
    c = steps.c
    head = conn.execute(
        select(c.attempt, c.step, func.min(c.start_time), func.max(c.end_time), func.sum(c.loss), func.count(c.loss),
               func.max(c.lr))
        .where(c.run_pk == run_pk).group_by(c.attempt, c.step)).all()
    parts = [pd.DataFrame(np.array([[np.nan if v is None else float(v) for v in row] for row in head],
                                   dtype=np.float64).reshape(-1, len(_PARTS)), columns=list(_PARTS))]
    moved = column_rows(conn, run_pk)
    if len(moved):
        rows = moved.rows
        has_loss = ~np.isnan(rows.loss)
        parts.append(pd.DataFrame({
            "attempt": moved.attempt.astype(np.float64), "step": rows.step.astype(np.float64), "start": rows.start,
            "end": rows.end, "loss_sum": np.where(has_loss, rows.loss, 0.0), "loss_count": has_loss.astype(np.float64),
            "lr": rows.lr}))
    both = pd.concat(parts, ignore_index=True)
    if both.empty:
        return pd.DataFrame({name: pd.Series([], dtype=np.float64) for name in CURVE_COLUMNS})
    both["loss_sum"] = both["loss_sum"].fillna(0.0)
    reduced = both.groupby(["attempt", "step"], sort=True).agg(
        start=("start", "min"), end=("end", "max"), loss_sum=("loss_sum", "sum"), loss_count=("loss_count", "sum"),
        lr=("lr", "max")).reset_index()
    count = reduced["loss_count"].to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        reduced["loss"] = np.where(count > 0, reduced["loss_sum"].to_numpy(np.float64) / count, np.nan)
    frame = reduced[list(CURVE_COLUMNS)].copy()
    frame["attempt"] = frame["attempt"].astype(np.int64)
    frame["step"] = frame["step"].astype(np.int64)
    return frame
