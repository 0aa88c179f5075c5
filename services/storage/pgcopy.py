"""PostgreSQL binary COPY of the step table's rows, encoded with numpy (no per-row Python). (The analyses' numeric reads
are services.storage.pgarrays.)

Every column is fixed width and never NULL (missing loss / lr / comm are NaN), so a row is a numpy record.
"""

from __future__ import annotations

import numpy as np

HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
TRAILER = (-1).to_bytes(2, "big", signed=True)

STEP_COPY_COLUMNS = ("run_pk", "attempt", "rank", "step", "start_time", "end_time", "loss", "lr", "comm")
_STEP_TYPES = (">i4", ">i4", ">i4", ">i8", ">f8", ">f8", ">f8", ">f8", ">f8")


def _row_dtype(names: tuple[str, ...], types: tuple[str, ...]) -> np.dtype:
    fields: list[tuple[str, str]] = [("_nfields", ">i2")]
    for name, typ in zip(names, types, strict=True):
        fields += [(f"_len_{name}", ">i4"), (name, typ)]
    return np.dtype(fields)


STEP_ROW = _row_dtype(STEP_COPY_COLUMNS, _STEP_TYPES)


def encode_step_rows(
    run_pk: np.ndarray, attempt: np.ndarray, rank: np.ndarray, step: np.ndarray, start: np.ndarray,
    end: np.ndarray, loss: np.ndarray, lr: np.ndarray, comm: np.ndarray,
) -> bytes:
    """Rows -> the body of `COPY steps (...) FROM STDIN (FORMAT binary)` without header and trailer."""
    rows = np.empty(len(step), dtype=STEP_ROW)
    rows["_nfields"] = len(STEP_COPY_COLUMNS)
    for name, values in zip(STEP_COPY_COLUMNS, (run_pk, attempt, rank, step, start, end, loss, lr, comm), strict=True):
        rows[f"_len_{name}"] = STEP_ROW[name].itemsize
        rows[name] = values
    return rows.tobytes()
