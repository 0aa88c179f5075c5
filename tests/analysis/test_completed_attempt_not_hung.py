"""A run whose current attempt ended `completed` on every rank is never called hung, with or without run_end."""

from __future__ import annotations

from tests.analysis.scenarios import T0, ev, per_rank, steps
from tests.live_database import LiveDatabase


def test_a_run_whose_ranks_all_completed_their_attempt_is_not_hung_however_long_it_waits_for_run_end(
        live_db: LiveDatabase) -> None:
    events = [ev("attempt_start", 0, attempt=0, rank=r, world_size=2, host="h0") for r in range(2)]
    events += steps(0, 2, 1, 20, 1.0) + per_rank("attempt_end", 21, 2, attempt=0, reason="completed")
    run = live_db.store(events)
    for waited_s in (60.0, 3600.0, 86400.0):
        assert not run.status(T0 + 21 + waited_s).hung


def test_a_run_where_one_rank_has_not_completed_is_still_judged(live_db: LiveDatabase) -> None:
    events = [ev("attempt_start", 0, attempt=0, rank=r, world_size=2, host="h0") for r in range(2)]
    events += [*steps(0, 2, 1, 20, 1.0), ev("attempt_end", 21, attempt=0, rank=0, reason="completed")]
    assert live_db.store(events).status(T0 + 21 + 3600.0).hung
