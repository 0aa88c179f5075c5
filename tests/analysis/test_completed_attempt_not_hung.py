"""A run whose current attempt ended `completed` on every rank is never called hung, with or without run_end."""

from __future__ import annotations

from services.analysis.live import detect_hang, live_state_from_run_data
from services.analysis.run_data import run_data_from_events
from tests.analysis.scenarios import T0, ev, per_rank, steps


def test_a_run_whose_ranks_all_completed_their_attempt_is_not_hung_however_long_it_waits_for_run_end() -> None:
    events = [ev("attempt_start", 0, attempt=0, rank=r, world_size=2, host="h0") for r in range(2)]
    events += steps(0, 2, 1, 20, 1.0) + per_rank("attempt_end", 21, 2, attempt=0, reason="completed")
    state = live_state_from_run_data(run_data_from_events("s1", events))
    for waited_s in (60.0, 3600.0, 86400.0):
        assert not detect_hang(state, T0 + 21 + waited_s).hung


def test_a_run_where_one_rank_has_not_completed_is_still_judged() -> None:
    events = [ev("attempt_start", 0, attempt=0, rank=r, world_size=2, host="h0") for r in range(2)]
    events += [*steps(0, 2, 1, 20, 1.0), ev("attempt_end", 21, attempt=0, rank=0, reason="completed")]
    state = live_state_from_run_data(run_data_from_events("s1", events))
    assert detect_hang(state, T0 + 21 + 3600.0).hung
