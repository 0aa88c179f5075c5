"""A step's seconds inside collectives, one rule everywhere (services.analysis.collective_time), checked against
sums worked by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from services.analysis.collective_time import calls_seconds, comm_frame, step_collective_seconds, sum_collective_seconds
from services.analysis.run_data import collectives_frame

NAN = float("nan")


def calls(*rows: tuple[int, int, int, str, float, float]) -> pd.DataFrame:
    attempt, rank, step, op, start, end = zip(*rows, strict=True)
    return collectives_frame(attempt, rank, step, op, start, end)


def seconds_by_key(frame: pd.DataFrame) -> dict[tuple[int, int, int], float]:
    return {(int(a), int(r), int(s)): float(x)
            for a, r, s, x in frame[["attempt", "rank", "step", "seconds"]].itertuples(index=False)}


def test_each_call_counts_once_however_often_it_was_recorded() -> None:
    frame = calls(
        (0, 0, 5, "all_reduce", 100.0, 100.25),
        (0, 0, 5, "all_reduce", 100.0, 100.25),  # the same call again (a replayed spool)
        (0, 0, 5, "all_gather", 101.0, 101.5),
        (0, 1, 5, "all_reduce", 100.0, 100.75),  # another rank: its own call at the same instant
        (1, 0, 5, "all_reduce", 100.0, 100.125),  # another attempt's step 5
    )
    assert seconds_by_key(calls_seconds(frame)) == {(0, 0, 5): 0.75, (0, 1, 5): 0.75, (1, 0, 5): 0.125}


def test_two_calls_of_one_rank_that_share_a_start_count_once_whatever_op_they_name() -> None:
    # A rank runs its collectives one after another: a shared start is one call recorded twice, and counting both
    # would count the same wall time twice.
    frame = calls((0, 0, 1, "all_reduce", 10.0, 10.5), (0, 0, 1, "broadcast", 10.0, 10.5),
                  (0, 0, 1, "barrier", 11.0, 11.25))
    assert seconds_by_key(calls_seconds(frame)) == {(0, 0, 1): 0.75}


def test_the_storage_path_and_the_frame_path_sum_alike() -> None:
    frame = calls((0, 0, 1, "a", 1.0, 1.5), (0, 0, 1, "a", 1.0, 1.5), (0, 2, 3, "b", 2.0, 4.0))
    direct = sum_collective_seconds(frame["attempt"].to_numpy(), frame["rank"].to_numpy(),
                                    frame["step"].to_numpy(), frame["start"].to_numpy(), frame["end"].to_numpy())
    pd.testing.assert_frame_equal(direct, calls_seconds(frame))
    assert calls_seconds(collectives_frame()).empty


def test_a_steps_own_comm_wins_and_its_calls_fill_only_the_steps_that_reported_none() -> None:
    steps = pd.DataFrame({"attempt": [0, 0, 0, 1], "rank": [0, 0, 1, 0], "step": [1, 2, 1, 1],
                          "comm": [0.5, NAN, NAN, NAN]})
    comm = comm_frame([0, 0, 0], [0, 0, 1], [1, 2, 1], [9.0, 0.25, 0.125])
    got = step_collective_seconds(steps, comm)
    np.testing.assert_array_equal(got, [0.5, 0.25, 0.125, NAN])  # (attempt 1, step 1): no calls, unknown
    np.testing.assert_array_equal(step_collective_seconds(steps, None), steps["comm"].to_numpy())


def test_one_ranks_steps_are_matched_by_attempt_and_step() -> None:
    steps = pd.DataFrame({"attempt": [0, 0], "step": [1, 2], "comm": [NAN, 0.5]})
    comm = comm_frame([0, 0], [3, 3], [1, 2], [0.25, 7.0])
    np.testing.assert_array_equal(step_collective_seconds(steps, comm), [0.25, 0.5])


@pytest.mark.parametrize("replays", [1, 2, 5])
def test_the_straggler_compute_is_the_step_minus_its_calls_counted_once(replays: int) -> None:
    from services.analysis.run_data import run_data_from_events
    from services.analysis.stragglers import step_compute
    from tests.analysis.scenarios import ev

    events = [ev("step", 100.0 + s, attempt=0, rank=0, step=s, start=100.0 + s, end=100.8 + s) for s in (1, 2)]
    events += [ev("collective", 100.2 + s, attempt=0, rank=0, step=s, op="all_reduce", start=100.2 + s,
                  end=100.5 + s) for s in (1, 2) for _ in range(replays)]
    data = run_data_from_events("s1", events)
    steps = data.steps.sort_values("step").reset_index(drop=True)
    compute = step_compute(data, steps)
    np.testing.assert_allclose(compute.seconds, [0.5, 0.5])
    assert compute.known.all()
