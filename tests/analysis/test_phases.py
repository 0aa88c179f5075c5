"""Phases outside the steps (`phase_start` / `phase_end`): evaluation is its own figure, apart from idle and from
waste; a round that waits in `init_process_group` for peers that never come is waiting for a failure to be
detected, and live detection, the provisional ledger and the final ledger say so from the same moment. Ledgers
worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from services.analysis.ledger import build_ledger
from services.analysis.live import LiveConfig
from services.analysis.provisional import LiveHang, provisional_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.usage import clip_usage
from tests.analysis.scenarios import T0, ev, per_rank, steps
from tests.ledger_checks import assert_ledger as expect
from tests.ledger_checks import assert_partition
from tests.ledger_checks import ledger_of_events as ledger_of
from tests.live_database import LiveDatabase

W = 2
Events = list[dict[str, Any]]


def phase(kind: str, time: float, rank: int, name: str, step: int, **fields: Any) -> dict[str, Any]:
    return ev(kind, time, attempt=0, rank=rank, name=name, step=step, **fields)


def started(world: int = W, *, alloc_end: float | None = 100.0) -> Events:
    out = [ev("allocation_start", 0, gpus=world)]
    if alloc_end is not None:
        out.append(ev("allocation_end", alloc_end))
    out += [ev("attempt_start", 0, attempt=0, rank=r, world_size=world, host="h0") for r in range(world)]
    return out


def finished(at: float, world: int = W) -> Events:
    return [*per_rank("attempt_end", at, world, attempt=0, reason="completed"), ev("run_end", at, status="finished")]


# -- eval -------------------------------------------------------------------------------------------------------


def with_eval(*, rank1_end: float | None = 35.0) -> Events:
    """Steps 1-20 from 5 to 25; both ranks evaluate after step 20 (rank 0 25-34, rank 1 25.5-35); steps 21-40 from
    35 to 55; completed at 60; allocated 0-100."""
    out = started()
    out += per_rank("resume", 0, W, attempt=0, step=0)
    out += steps(0, W, 1, 20, 5)
    out += [phase("phase_start", 25, 0, "eval", 20), phase("phase_end", 34, 0, "eval", 20, ok=True),
            phase("phase_start", 25.5, 1, "eval", 20)]
    if rank1_end is not None:
        out.append(phase("phase_end", rank1_end, 1, "eval", 20, ok=True))
    out += steps(0, W, 21, 40, 35)
    return out + finished(60)


def test_evaluation_between_steps_is_eval_not_idle_and_the_identity_includes_it() -> None:
    ledger = ledger_of(with_eval())
    # first rank's start (25) to the last rank's end (35), on both GPUs; idle is only 55-60 and the tail 60-100
    expect(ledger, 40 * W, eval=10 * W, startup=5 * W, idle=(5 + 40) * W)
    assert ledger.attempts[0].gpu_seconds["eval"] == pytest.approx(10 * W)
    assert ledger.goodput == pytest.approx(40 / 100)  # eval is not productive: goodput is training's share
    assert ledger.waste_total_gpu_seconds == pytest.approx((5 + 45) * W)  # nor waste
    usage = ledger.usage
    assert usage is not None
    assert clip_usage(usage, T0 + 25, T0 + 35)["eval"] == pytest.approx(10 * W)


def test_an_evaluation_whose_end_was_lost_lasts_until_the_next_step() -> None:
    events = [e for e in with_eval() if e["kind"] != "phase_end"]
    expect(ledger_of(events), 40 * W, eval=10 * W, startup=5 * W, idle=(5 + 40) * W)


def test_an_evaluation_cut_by_a_failure_is_the_failures_hang_not_eval() -> None:
    out = started(alloc_end=60)
    out += per_rank("resume", 0, W, attempt=0, step=0)
    out += steps(0, W, 1, 20, 5)
    out += [phase("phase_start", 25, r, "eval", 20) for r in range(W)]  # never ended: stuck in an eval collective
    out += per_rank("attempt_end", 50, W, attempt=0, reason="failed")
    out.append(ev("run_end", 50, status="failed"))
    # nothing saved: the 20 steps are rework; 25 -> 50 is the hang, 50 -> 60 its teardown
    expect(ledger_of(out), 0.0, startup=5 * W, rework=20 * W, hang=(25 + 10) * W)


def test_an_evaluation_before_the_first_step_is_eval_not_startup() -> None:
    out = started()
    out += per_rank("resume", 0, W, attempt=0, step=0)
    out += [phase("phase_start", 4, r, "eval", 0) for r in range(W)]  # Lightning's sanity check, eval_on_start
    out += [phase("phase_end", 9, r, "eval", 0, ok=True) for r in range(W)]
    out += steps(0, W, 1, 20, 10)
    out += finished(30)
    expect(ledger_of(out), 20 * W, eval=5 * W, startup=(4 + 1) * W, idle=70 * W)


def test_a_checkpoint_written_inside_an_evaluation_is_checkpoint() -> None:
    out = [e for e in with_eval()]
    out += per_rank("checkpoint_start", 30, W, attempt=0, step=20)
    out += per_rank("checkpoint_end", 32, W, attempt=0, step=20, ok=True)
    expect(ledger_of(out), 40 * W, eval=8 * W, checkpoint=2 * W, startup=5 * W, idle=45 * W)


# -- waiting in init_process_group ------------------------------------------------------------------------------


def waiting_for_a_peer(*, until: float, ended: bool) -> Events:
    """World 2: rank 0 enters init_process_group at 10 and waits for rank 1, which started (2) and never came. Its
    heartbeats go on while it waits; with `ended`, its init times out at 70 and the attempt and run fail
    (allocated 0-100)."""
    out = started(alloc_end=100.0 if ended else None)
    out.append(phase("phase_start", 10, 0, "init_process_group", 0))
    out += [ev("heartbeat", t, attempt=0, rank=0, step=1) for t in range(15, int(until) + 1, 5)]
    if ended:
        out.append(phase("phase_end", 70, 0, "init_process_group", 0, ok=False))
        out.append(ev("attempt_end", 70, attempt=0, rank=0, reason="failed"))
        out.append(ev("run_end", 70, status="failed"))
    return out


def test_a_round_that_failed_waiting_for_a_peer_in_init_process_group_waited_as_in_a_hang() -> None:
    ledger = ledger_of(waiting_for_a_peer(until=70, ended=True))
    # startup ends where the wait begins (10); 10 -> 70 was waiting for the failure to be detected; 70 -> 100 the
    # teardown of a run that failed for good
    expect(ledger, 0.0, startup=10 * W, hang=(60 + 30) * W)


def test_a_few_seconds_in_a_successful_init_process_group_stay_startup() -> None:
    out = started()
    out += [phase("phase_start", 10 + r, r, "init_process_group", 0) for r in range(W)]
    out += [phase("phase_end", 14, r, "init_process_group", 0, ok=True) for r in range(W)]
    out += per_rank("resume", 15, W, attempt=0, step=0)
    out += steps(0, W, 1, 20, 20)
    out += finished(40)
    expect(ledger_of(out), 20 * W, startup=20 * W, idle=60 * W)


def test_a_round_that_got_through_init_process_group_and_died_before_stepping_is_startup_as_before() -> None:
    out = started(alloc_end=50)
    out += [phase("phase_start", 10, r, "init_process_group", 0) for r in range(W)]
    out += [phase("phase_end", 12, r, "init_process_group", 0, ok=True) for r in range(W)]
    out += per_rank("attempt_end", 30, W, attempt=0, reason="failed")  # e.g. a checkpoint that did not load
    out.append(ev("run_end", 30, status="failed"))
    expect(ledger_of(out), 0.0, startup=30 * W, hang=20 * W)


def test_a_killed_round_waiting_in_init_process_group_is_hang_until_its_last_sign_of_life() -> None:
    out = [e for e in waiting_for_a_peer(until=40, ended=False)]
    out.append(ev("allocation_end", 100))
    out += [ev("attempt_start", 50, attempt=1, rank=r, world_size=W) for r in range(W)]
    out += [ev("phase_start", 52, attempt=1, rank=r, name="init_process_group", step=0) for r in range(W)]
    out += [ev("phase_end", 55, attempt=1, rank=r, name="init_process_group", step=0, ok=True) for r in range(W)]
    out += [ev("resume", 56, attempt=1, rank=r, step=0) for r in range(W)]
    out += steps(1, W, 1, 20, 60)
    out += [ev("attempt_end", 80, attempt=1, rank=r, reason="completed") for r in range(W)]
    out.append(ev("run_end", 80, status="finished"))
    # attempt 0: startup 0-10, waiting 10-40 (its last heartbeat: SIGKILLed there); 40 -> 60 the restart's startup
    expect(ledger_of(out), 20 * W, startup=(10 + 20) * W, hang=30 * W, idle=20 * W)


def test_live_the_provisional_ledger_and_the_final_ledger_date_the_wait_from_the_same_moment(
        live_db: LiveDatabase) -> None:
    config = LiveConfig(floor_s=10.0, startup_floor_s=20.0)
    events = waiting_for_a_peer(until=45, ended=False)
    stored = build_ledger(run_data_from_events("s1", events))
    assert_partition(stored)
    assert stored.waste_gpu_seconds.startup == pytest.approx(10 * W)  # not the whole wait so far
    assert stored.running_tail is not None and stored.running_tail.since == T0 + 10

    live = live_db.store(events).status(T0 + 45, config)
    assert live.last_progress_time == T0 + 10  # entering init_process_group
    assert live.threshold_basis == "startup" and live.hung, live
    provisional = provisional_ledger(stored, LiveHang(since=T0 + 10), T0 + 45)
    assert_partition(provisional)
    assert provisional.provisional is not None
    assert provisional.waste_gpu_seconds.hang == pytest.approx(35 * W)  # 10 -> 45
    assert provisional.waste_gpu_seconds.startup == pytest.approx(10 * W)

    final = ledger_of(waiting_for_a_peer(until=70, ended=True))
    assert final.waste_gpu_seconds.startup == provisional.waste_gpu_seconds.startup
    assert final.usage is not None and provisional.usage is not None
    # over the same stretch, the final ledger books what the live one did
    assert clip_usage(final.usage, T0, T0 + 45) == pytest.approx(clip_usage(provisional.usage, T0, T0 + 45))


def test_before_it_is_hung_a_short_wait_is_not_called_a_hang(live_db: LiveDatabase) -> None:
    live = live_db.store(waiting_for_a_peer(until=25, ended=False)).status(T0 + 25, LiveConfig())
    assert not live.hung and live.threshold_seconds == 300.0


def test_a_long_evaluation_is_judged_against_the_phase_floor_not_ten_steps(live_db: LiveDatabase) -> None:
    out = started(alloc_end=None)
    out += per_rank("resume", 0, W, attempt=0, step=0)
    out += steps(0, W, 1, 20, 5)
    out += [phase("phase_start", 25, r, "eval", 20) for r in range(W)]
    run = live_db.store(out)
    live = run.status(T0 + 125, LiveConfig())
    assert live.last_progress_time == T0 + 25 and live.threshold_basis == "phase" and not live.hung, live
    assert run.status(T0 + 330, LiveConfig()).hung
