"""The plausibility check of step and collective rows takes a request's few rows with Python's comparisons and many
with NumPy's (services.collector.plausibility); both paths refuse the same rows and name the same event and field,
and the column extremes the request's path reads (services.storage.records) are exact on either side of the cut."""

from __future__ import annotations

import time

import numpy as np
import pytest

from services.collector.plausibility import check_plausible
from services.errors import InvalidBatch
from services.settings import PlausibilitySettings
from services.storage.records import SMALL, IngestRecord, StepRows, column_max, column_min

LIMITS = PlausibilitySettings()
NOW = time.time()


def record(index: int, rows: int, *, long_at: int | None = None, future_at: int | None = None) -> IngestRecord:
    start = NOW - 3 * 86_400 + index * 100 + np.arange(rows, dtype=np.float64)
    end = start + 0.5
    if long_at is not None:
        end[long_at] = start[long_at] + LIMITS.max_step_s + 1
    if future_at is not None:
        end[future_at] = NOW + LIMITS.max_future_s + 60
    nan = np.full(rows, np.nan)
    steps = StepRows(step=np.arange(rows, dtype=np.int64) + index * rows, start=start, end=end, loss=nan, lr=nan,
                     comm=nan)
    return IngestRecord(run_id="r", event_id=f"e{index}", kind="steps", time=float(start.max()), attempt=0, rank=index,
                        step=int(steps.step.max()), data={"n": rows}, step_rows=steps)


# (records in the batch, rows each): one small record, one past the cut, many small ones past it together
SHAPES = [(1, 2), (1, SMALL + 36), (40, 5)]


@pytest.mark.parametrize(("records", "rows"), SHAPES)
def test_plausible_rows_pass_on_either_path(records: int, rows: int) -> None:
    check_plausible([record(i, rows) for i in range(records)], LIMITS, now=NOW)


@pytest.mark.parametrize(("records", "rows"), SHAPES)
@pytest.mark.parametrize("fault", ["long_at", "future_at"])
def test_the_first_implausible_row_is_named_on_either_path(records: int, rows: int, fault: str) -> None:
    bad, at = records - 1, rows - 1
    batch = [record(i, rows, **({fault: at} if i == bad else {})) for i in range(records)]
    with pytest.raises(InvalidBatch) as raised:
        check_plausible(batch, LIMITS, now=NOW)
    error = raised.value
    assert error.details == {"index": bad, "event_id": f"e{bad}", "field": f"end.{at}"}
    assert ("GOODPUT_MAX_STEP_S" if fault == "long_at" else "GOODPUT_MAX_FUTURE_S") in str(error)


@pytest.mark.parametrize("n", [1, 3, SMALL, SMALL + 1, 1000])
def test_column_extremes_are_exact_for_64_bit_steps_and_floats(n: int) -> None:
    rng = np.random.default_rng(n)
    steps = (1 << 62) + rng.permutation(n).astype(np.int64)
    assert column_max(steps) == (1 << 62) + n - 1 and column_min(steps) == 1 << 62
    assert type(column_max(steps)) is int and type(column_min(steps)) is int
    times = NOW + rng.random(n)
    assert column_max(times) == float(times.max()) and column_min(times) == float(times.min())
