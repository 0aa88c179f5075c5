"""Failure teardown is failure cost: the time from a failure's detection to the next attempt's start (startup)
or, when no attempt follows, to the allocation's end (hang) is never idle. Ledgers worked out by hand."""

from __future__ import annotations

import pytest

from tests.analysis.scenarios import attempt_events, ev
from tests.ledger_checks import assert_ledger as expect
from tests.ledger_checks import ledger_of_events as ledger_of


def failed_for_good(gpus: int = 4) -> list[dict]:  # type: ignore[type-arg]
    """World 4. Allocated 0-130. Steps 1-50 from 10 to 60; the hang is detected at 100 (attempt_end failed,
    run_end failed); torchrun and the launcher tear the job down until 130 (allocation_end)."""
    w = 4
    out = [ev("allocation_start", 0, gpus=gpus), ev("allocation_end", 130)]
    out += attempt_events(0, w, 0, resumed=0, last_step=50, steps_from=10, end=100, reason="failed")
    out.append(ev("run_end", 100, status="failed"))
    return out


def test_teardown_of_a_run_that_failed_for_good_is_hang_not_idle() -> None:
    ledger = ledger_of(failed_for_good())
    # startup 0-10, the 50 steps thrown away (nothing saved), hang 60-100 and the teardown 100-130
    expect(ledger, 0.0, startup=10 * 4, rework=50 * 4, hang=(40 + 30) * 4)
    assert ledger.attempts[0].gpu_seconds["hang"] == pytest.approx(70 * 4)


def test_teardown_counts_on_the_worlds_gpus_and_the_allocations_other_gpus_stay_idle() -> None:
    ledger = ledger_of(failed_for_good(gpus=8))
    expect(ledger, 0.0, startup=10 * 4, rework=50 * 4, hang=(40 + 30) * 4, idle=130 * 4)


def test_teardown_of_an_attempt_that_never_stepped_is_hang_after_its_startup() -> None:
    w = 2
    events = [ev("allocation_start", 0, gpus=w), ev("allocation_end", 70)]
    events += attempt_events(0, w, 0, end=40, reason="failed")  # died in init_process_group
    events.append(ev("run_end", 40, status="failed"))
    expect(ledger_of(events), 0.0, startup=40 * w, hang=30 * w)


def test_after_a_failure_the_next_attempt_in_the_same_allocation_books_the_teardown_as_startup() -> None:
    w = 2
    events = [ev("allocation_start", 0, gpus=w), ev("allocation_end", 100)]
    events += attempt_events(0, w, 0, last_step=20, steps_from=5, end=30, reason="failed")  # 5-25, resumed from 0
    events += attempt_events(1, w, 60, resumed=60, last_step=30, steps_from=65, end=95)  # 65-95
    events.append(ev("run_end", 95, status="finished"))
    # detection at 30 -> first step of attempt 1 at 65: startup (restart cost), as in the reference scenario
    expect(ledger_of(events), 30 * w, startup=(5 + 35) * w, rework=20 * w, hang=5 * w, idle=5 * w)


def test_a_failure_whose_restart_comes_in_a_new_allocation_books_the_old_allocations_tail_as_hang() -> None:
    w = 2
    events = [ev("run_submitted", 0), ev("allocation_start", 0, gpus=w), ev("allocation_end", 50),
              ev("allocation_start", 80, gpus=w), ev("allocation_end", 130)]
    events += attempt_events(0, w, 0, last_step=20, steps_from=5, end=35, reason="failed")  # 5-25
    events += attempt_events(1, w, 90, resumed=90, last_step=30, steps_from=95, end=125)  # 95-125
    events.append(ev("run_end", 125, status="finished"))
    ledger = ledger_of(events)
    # allocation 1: startup 0-5, rework 5-25, hang 25-35 and 35-50 (torn down, requeued); allocation 2: startup
    # 80-95, kept 95-125, idle 125-130
    expect(ledger, 30 * w, startup=(5 + 15) * w, rework=20 * w, hang=(10 + 15) * w, idle=5 * w)
    assert ledger.queue_seconds == pytest.approx(30)


def test_a_completed_run_keeps_its_allocation_tail_idle() -> None:
    w = 2
    events = [ev("allocation_start", 0, gpus=w), ev("allocation_end", 50)]
    events += attempt_events(0, w, 0, last_step=30, steps_from=5, end=35)
    events.append(ev("run_end", 35, status="finished"))
    expect(ledger_of(events), 30 * w, startup=5 * w, idle=15 * w)
