"""Copies of one step (a replay that regroups steps) count once, whatever order the rows come in.

`dedupe_steps` takes a numpy path when the rows are already sorted or have no copies; both must give exactly
what the plain rule gives: sort by (attempt, rank, step, start, end), keep the first of each step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.analysis.attempts import dedupe_steps
from services.analysis.run_data import steps_frame


def the_rule(steps: pd.DataFrame) -> pd.DataFrame:
    ordered = steps.sort_values(["attempt", "rank", "step", "start", "end"], kind="stable")
    return ordered.drop_duplicates(["attempt", "rank", "step"], keep="first").reset_index(drop=True)


def frame(rows: list[tuple[int, int, int, float]]) -> pd.DataFrame:
    a, r, s, t = zip(*rows, strict=True) if rows else ((), (), (), ())
    start = np.asarray(t, dtype=np.float64)
    return steps_frame(attempt=a, rank=r, step=s, start=start, end=start + 1.0, comm=[0.1] * len(rows))


rows = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 40),
                          st.floats(0, 1000, allow_nan=False)), max_size=200)


@settings(max_examples=200, deadline=None)
@given(rows=rows, arrangement=st.sampled_from(["as drawn", "sorted unique", "shuffled unique"]))
def test_same_rows_as_the_rule(rows: list[tuple[int, int, int, float]], arrangement: str) -> None:
    steps = frame(rows)
    if arrangement != "as drawn":
        steps = the_rule(steps)  # no copies left
        if arrangement == "shuffled unique":
            steps = steps.sample(frac=1.0, random_state=len(rows)).reset_index(drop=True)
    pd.testing.assert_frame_equal(dedupe_steps(steps), the_rule(steps))


@pytest.mark.parametrize("big", [{"step": 2**40}, {"rank": 2**22}, {"attempt": 2**16}])
def test_numbers_too_big_to_pack_take_the_plain_rule(big: dict[str, int]) -> None:
    base = {"attempt": 0, "rank": 1, "step": 5}
    attempt, rank, step = (big.get(k, base[k]) for k in ("attempt", "rank", "step"))
    rows = [(attempt, rank, step, 3.0), (0, 1, 5, 2.0), (0, 1, 5, 1.0)]
    steps = frame(rows)
    got = dedupe_steps(steps)
    pd.testing.assert_frame_equal(got, the_rule(steps))
    assert len(got) == 2 and got["start"].min() == 1.0
