"""An attempt killed without a word (SIGKILL, OOM killer, a lost node: no `attempt_end` on any rank) and followed
by another ends at its latest event of any kind: hang from its last progress to there (alive, not progressing),
then detection, teardown and relaunch up to the next attempt's first step are the restart's startup. Ledgers
worked out by hand."""

from __future__ import annotations

import pytest

from tests.analysis.scenarios import attempt_events, ev, per_rank, reference_s1
from tests.ledger_checks import assert_ledger as expect
from tests.ledger_checks import ledger_of_events as ledger_of

W = 2



def killed_then_restarted(after_last_step: list[dict], alloc_end: float = 100) -> list[dict]:  # type: ignore[type-arg]
    """World 2, allocated 0-alloc_end. Attempt 0: steps 1-20 from 5 to 25, then `after_last_step`, no
    attempt_end. Attempt 1 starts at 40, resumes from 0, steps 1-30 from 50 to 80, completes at 80."""
    events = [ev("allocation_start", 0, gpus=W), ev("allocation_end", alloc_end)]
    events += attempt_events(0, W, 0, resumed=0, last_step=20, steps_from=5)
    events += after_last_step
    events += attempt_events(1, W, 40, resumed=40, last_step=30, steps_from=50, end=80)
    events.append(ev("run_end", 80, status="finished"))
    return events


def test_a_killed_attempt_silent_after_its_last_step_ends_there_and_the_rest_is_the_restarts_startup() -> None:
    ledger = ledger_of(killed_then_restarted([]))
    # startup 0-5 and 25 (last event) -> 50 (attempt 1's first step); no hang: nothing says it was stuck
    expect(ledger, 30 * W, startup=(5 + 25) * W, rework=20 * W, idle=20 * W)
    first = ledger.attempts[0]
    assert first.failed and not first.end_reported
    assert first.end == pytest.approx(25 + 1_700_000_000.0)
    assert first.gpu_seconds.get("hang", 0.0) == pytest.approx(0.0)


def test_heartbeats_after_the_last_step_are_hang_up_to_the_last_one() -> None:
    beats = [ev("heartbeat", t, attempt=0, rank=r, step=21, collectives=1) for t in (27, 32) for r in range(W)]
    ledger = ledger_of(killed_then_restarted(beats))
    # alive but not progressing 25 -> 32 (hang), then detection, teardown and relaunch 32 -> 50 (startup)
    expect(ledger, 30 * W, startup=(5 + 18) * W, rework=20 * W, hang=7 * W, idle=20 * W)
    assert ledger.attempts[0].gpu_seconds["hang"] == pytest.approx(7 * W)


@pytest.mark.parametrize("kind", ["digest", "client_stats"])
def test_any_kind_of_event_shows_the_attempt_alive(kind: str) -> None:
    ledger = ledger_of(killed_then_restarted([ev(kind, 30, attempt=0, rank=0, step=20, value="ab")]))
    expect(ledger, 30 * W, startup=(5 + 20) * W, rework=20 * W, hang=5 * W, idle=20 * W)


def test_a_write_torn_by_the_kill_blocks_until_the_attempts_last_event() -> None:
    after = per_rank("checkpoint_start", 25, W, attempt=0, step=20)
    after += [ev("heartbeat", 29, attempt=0, rank=r, step=21) for r in range(W)]
    ledger = ledger_of(killed_then_restarted(after))
    expect(ledger, 30 * W, startup=(5 + 21) * W, checkpoint=4 * W, rework=20 * W, idle=20 * W)


def test_an_event_stamped_after_the_next_attempts_start_ends_the_killed_attempt_at_that_start() -> None:
    late = [ev("heartbeat", 45, attempt=0, rank=0, step=21)]  # a skewed clock on one node
    ledger = ledger_of(killed_then_restarted(late))
    expect(ledger, 30 * W, startup=(5 + 10) * W, rework=20 * W, hang=15 * W, idle=20 * W)


def test_a_killed_attempt_requeued_into_a_new_allocation_books_its_allocations_tail_as_teardown() -> None:
    events = [ev("allocation_start", 0, gpus=W), ev("allocation_end", 50),
              ev("allocation_start", 80, gpus=W), ev("allocation_end", 130)]
    events += attempt_events(0, W, 0, last_step=20, steps_from=5)  # 5-25
    events += [ev("heartbeat", 30, attempt=0, rank=r) for r in range(W)]
    events += attempt_events(1, W, 90, resumed=90, last_step=30, steps_from=95, end=125)  # 95-125
    events.append(ev("run_end", 125, status="finished"))
    # hang 25-30 (heart-beating) and 30-50 (torn down, no attempt in this allocation); startup 0-5 and 80-95
    expect(ledger_of(events), 30 * W, startup=(5 + 15) * W, rework=20 * W, hang=(5 + 20) * W, idle=5 * W)


def test_without_allocation_events_the_killed_attempt_still_holds_its_gpus_until_the_next_start() -> None:
    events = [e for e in killed_then_restarted([]) if not e["kind"].startswith("allocation")]
    ledger = ledger_of(events)
    # allocated = the attempts' spans 0-80, the killed one's reaching the next start: nothing lost, nothing idle
    assert ledger.allocated_gpu_seconds == pytest.approx(80 * W)
    expect(ledger, 30 * W, startup=(5 + 25) * W, rework=20 * W)


def test_the_last_attempt_of_a_failed_run_without_attempt_end_keeps_hang_to_the_run_end_and_teardown() -> None:
    events = [ev("allocation_start", 0, gpus=W), ev("allocation_end", 130)]
    events += attempt_events(0, W, 0, resumed=0, last_step=50, steps_from=10)  # 10-60
    events.append(ev("run_end", 100, status="failed"))  # the launcher saw the group die; no rank said so
    expect(ledger_of(events), 0.0, startup=10 * W, rework=50 * W, hang=(40 + 30) * W)


def test_the_reference_scenario_is_unchanged() -> None:
    ledger = ledger_of(reference_s1())
    expect(ledger, 2400, startup=480, checkpoint=160, rework=400, hang=480, idle=240)
