"""A run's job steps with their loss and learning rate, for the training curves (services.analysis.curves)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import Connection, func, select

from services.analysis.curves import CURVE_COLUMNS
from services.storage.tables import steps


def load_curve_steps(conn: Connection, run_pk: int) -> pd.DataFrame:
    """One row per (attempt, step): the first rank's start, the last rank's end, the mean loss and the highest lr of
    the ranks that reported them (NaN: none did); reduced in the database, so a run of millions of rows sends one
    row per step."""
    c = steps.c
    rows = conn.execute(
        select(c.attempt, c.step, func.min(c.start_time), func.max(c.end_time), func.avg(c.loss), func.max(c.lr))
        .where(c.run_pk == run_pk).group_by(c.attempt, c.step)).all()
    if not rows:
        return pd.DataFrame({name: pd.Series([], dtype=np.float64) for name in CURVE_COLUMNS})
    matrix = np.array([[np.nan if v is None else float(v) for v in row] for row in rows], dtype=np.float64)
    frame = pd.DataFrame(matrix, columns=list(CURVE_COLUMNS))
    frame["attempt"] = frame["attempt"].astype(np.int64)
    frame["step"] = frame["step"].astype(np.int64)
    return frame
