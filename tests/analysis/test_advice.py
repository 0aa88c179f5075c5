"""The advice engine on constructed runs, against figures worked out by hand (docs/advice.md states the rules)."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from services import presentation as fmt
from services.analysis.advice import AdviceConfig, AdviceInput, build_advice, failure_rate
from services.analysis.ledger import build_ledger
from services.analysis.resume_check import ResumeCheckConfig
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from services.reports.advice import formats_for
from services.schemas.advice import Recommendation, RunAdvice
from services.schemas.categories import WASTE_KEYS
from services.schemas.ledger import Allocation, AttemptLedger, CheckpointSummary, Ledger, ProvisionalHang
from services.schemas.resume import Finding, ResumeCheck, ResumeSummary, Tolerances
from services.schemas.views import Heatmap, RankCompute, RankRow, RunViews
from services.simulate import SimConfig, simulate
from tests.analysis.scenarios import ev, per_rank, steps
from tests.reports import ledgers


def gh(gpu_seconds: float, *, with_unit: bool = True) -> str:
    """A figure in GPU-hours, the unit of these runs' advice."""
    return fmt.gpu_time(gpu_seconds, fmt.GPU_HOURS, with_unit=with_unit)


def advise(ledger: Ledger, **inp: Any) -> RunAdvice:
    return build_advice(AdviceInput(ledger=ledger, **inp), formats_for(ledger))


def only(advice: RunAdvice, code: str) -> Recommendation:
    (rec,) = [r for r in advice.recommendations if r.code == code]
    return rec


def codes(advice: RunAdvice) -> list[str]:
    return [r.code for r in advice.recommendations]


def attempt(n: int = 0, *, world: int = 8, start: float = 0.0, end: float = 3600.0, failed: bool = False,
            **gpu_seconds: float) -> AttemptLedger:
    return AttemptLedger(attempt=n, start=start, end=end, end_reported=True, reason="failed" if failed else None,
                         failed=failed, world_size=world, hosts=[], resume_step=None, resume_reported=False,
                         first_step=None, last_step=None, steps_kept=0, steps_reworked=0, gpu_seconds=gpu_seconds)


def checkpoints(delta: float, every: float, steps: float | None = 100.0) -> CheckpointSummary:
    return CheckpointSummary(count=10, ok=10, failed=0, torn=0, median_blocking_seconds=delta,
                             median_interval_seconds=every, median_interval_steps=steps, last_ok_step=None)


def finished(allocated: float = 100_000.0, **fields: Any) -> Ledger:
    """A finished run's ledger; goodput = productive (what the waste leaves) / allocated."""
    base = ledgers.ledger(allocated, **fields)
    return base.model_copy(update={"goodput": base.productive_gpu_seconds / allocated if allocated else None})


def daly(delta: float, mtbf: float) -> float:  # Daly (2006), written out again here
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


# -- checkpoint interval: whose failures ------------------------------------------------------------------------


def peers_that_failed(n: int = 3, failures: int = 4, wall: float = 3600.0) -> list[Ledger]:
    return [finished(run_id=f"peer{i}", failures=failures, allocated_wall_seconds=wall, attempts=[attempt()])
            for i in range(n)]


def test_a_healthy_run_gets_no_checkpoint_advice_driven_by_other_runs_failures() -> None:
    healthy = finished(checkpoints=checkpoints(10.0, 310.0), failures=0, allocated_wall_seconds=3600.0,
                       attempts=[attempt()])
    peers = peers_that_failed()  # 12 failures in 4 h with the run: M = 1,200 s, Young 155 s < 300 s now
    rate = failure_rate(healthy, peers)
    assert rate is not None and rate.source == "project" and rate.mtbf_seconds == pytest.approx(14_400 / 12)
    advice = advise(healthy, peers=peers)
    assert "checkpoint_interval" not in codes(advice)
    (note,) = [n for n in advice.notes if "checkpoint-interval" in n]
    assert note.startswith("No checkpoint-interval advice: this run did not fail.")
    assert "rests on other runs' failures, not this run's" in note and "12 failures" in note


def test_the_same_run_with_its_own_failures_is_told_young_daly_from_its_own_rate() -> None:
    failing = finished(checkpoints=checkpoints(30.0, 1230.0), failures=4, allocated_wall_seconds=7200.0,
                       attempts=[attempt()], checkpoint=3000.0, rework=17_000.0)
    rec = only(advise(failing, peers=peers_that_failed(failures=40)), "checkpoint_interval")
    mtbf, now = 1800.0, 1200.0  # 7,200 s / 4 failures; 1,230 s between starts - a 30 s write
    best = daly(30.0, mtbf)
    assert best == pytest.approx(308.93, abs=0.01)
    saved = 80_000.0 * ((30 / now + now / (2 * mtbf)) - (30 / best + best / (2 * mtbf)))
    assert rec.gain.gpu_seconds == pytest.approx(saved, rel=1e-9)
    assert rec.gain.bound == "expected"
    assert rec.gain.predicted_goodput == pytest.approx(80_000 / (100_000 - saved), rel=1e-9)
    assert rec.gain.goodput_points == pytest.approx((80_000 / (100_000 - saved) - 0.8) * 100, rel=1e-9)
    conf = rec.confidence
    assert (conf.failure_rate_source, conf.failures, conf.runs) == ("run", 4, 1)
    assert conf.text == "this run's failure rate: 4 failures in 2 h 00 min"
    assert rec.title == f"Checkpoint more often: every {fmt.duration(best)} of compute (about 26 steps)"
    assert rec.wording.startswith(f"Checkpoint every {fmt.duration(best)} of compute (about 26 steps) instead of "
                                  "every 20 min 00 s of compute (about 100 steps): each write blocks training for "
                                  "30 s and the run fails about every 30 min 00 s")
    # the prediction is of the measured run, and says so
    assert rec.prediction == (f"Measured goodput 80.0% -> {fmt.percent(80_000 / (100_000 - saved))} if it "
                              f"checkpoints every {fmt.duration(best)} of compute (about 26 steps): "
                              f"{gh(saved)} saved, the same work on {gh(100_000 - saved)} "
                              f"instead of the {gh(100_000)} measured.")


def test_a_run_that_did_not_fail_may_be_told_to_checkpoint_less_often_and_is_told_why() -> None:
    calm = finished(checkpoints=checkpoints(30.0, 90.0, steps=60.0), failures=0, allocated_wall_seconds=3600.0,
                    attempts=[attempt()], checkpoint=30_000.0)
    rec = only(advise(calm, peers=peers_that_failed(failures=2)), "checkpoint_interval")
    mtbf = 14_400 / 6  # the run's hour and its 3 peers' hours, 6 failures
    assert rec.title.startswith("Checkpoint less often: every " + fmt.duration(daly(30.0, mtbf)))
    assert rec.wording.startswith("This run did not fail; at its project's failure rate (this run and 3 other runs "
                                  "of its project with 4-16 ranks: 6 failures in 4 h 00 min) it checkpoints more "
                                  "often than it needs to.")
    assert rec.confidence.failure_rate_source == "project" and rec.confidence.runs == 4


def test_a_small_saving_from_other_runs_failures_is_a_note_not_an_action() -> None:
    # 300 s of compute between writes of 30 s, Daly's about 370 s at the pooled MTBF of 2,400 s: w(300) - w(370)
    # = 0.1625 - 0.158 of 70,000 productive GPU-s is about 315 GPU-s, 0.3% of the allocation
    calm = finished(checkpoints=checkpoints(30.0, 330.0, steps=300.0), failures=0, allocated_wall_seconds=3600.0,
                    attempts=[attempt()], checkpoint=30_000.0)
    advice = advise(calm, peers=peers_that_failed(failures=2))
    assert "checkpoint_interval" not in codes(advice)
    assert any(n.startswith("Checkpoint interval: every ") and "less than 1.0% of the allocation" in n
               for n in advice.notes)


def test_other_teams_runs_of_another_size_do_not_count() -> None:
    run = finished(failures=1, allocated_wall_seconds=3600.0, attempts=[attempt(world=8)])
    big = [finished(run_id="big", failures=50, allocated_wall_seconds=3600.0, attempts=[attempt(world=64)])]
    rate = failure_rate(run, big)
    assert rate is not None and rate.source == "run" and rate.failures == 1  # its own, rough
    assert failure_rate(run.model_copy(update={"failures": 0}), big) is None


# -- idle: GPUs beyond the world size, through the ledger -------------------------------------------------------


def idle_gpu_events() -> list[dict[str, Any]]:
    """24 ranks on an allocation of 32 GPUs: allocated 0-110, startup 0-10, steps 1-100 from 10 to 110."""
    w, run = 24, "idle"
    out = [ev("run_submitted", 0, run), ev("allocation_start", 0, run, gpus=32)]
    out += [ev("attempt_start", 0, run, attempt=0, rank=r, world_size=w, host=f"h{r // 8}") for r in range(w)]
    out += per_rank("resume", 0, w, run, attempt=0, step=0)
    out += steps(0, w, 1, 100, 10, run_id=run)
    out += per_rank("attempt_end", 110, w, run, attempt=0, reason="completed")
    out += [ev("run_end", 110, run, status="finished"), ev("allocation_end", 110, run)]
    return out


def test_the_idle_gpu_run_is_told_about_its_unused_gpus() -> None:
    ledger = build_ledger(run_data_from_events("idle", idle_gpu_events()))
    # the ledger books the 8 GPUs beyond the world size as idle for the whole allocation (docs/ledger.md)
    assert ledger.allocated_gpu_seconds == pytest.approx(32 * 110)
    assert ledger.waste_gpu_seconds["idle"] == pytest.approx(8 * 110)
    assert ledger.productive_gpu_seconds == pytest.approx(24 * 100)
    rec = only(advise(ledger), "unused_gpus")
    assert rec.title == "8 of 32 GPUs never used"
    assert rec.wording.startswith("8 of 32 GPUs never used: the job ran 24 ranks on an allocation of 32 GPUs, so "
                                  "14.7 GPU-min (25.0% of the allocation) sat idle. Allocate only 24 GPUs")
    # GPU time in the unit the run's size calls for: 3,520 GPU-s allocated, under a GPU-hour: GPU-minutes
    assert rec.gain.gpu_seconds == pytest.approx(880.0) and rec.gain.bound == "expected"
    assert rec.gain.measured_goodput == pytest.approx(2400 / 3520)
    assert rec.gain.predicted_goodput == pytest.approx(2400 / 2640)
    assert rec.prediction.startswith("Measured goodput 68.2% -> 90.9% if only the 24 GPUs the job used were allocated")
    assert {e.key: e.value for e in rec.evidence}["unused_gpus"] == 8
    assert "idle_gaps" not in codes(advise(ledger))  # every idle second is on the unused GPUs


# -- hangs: the timeout setting and the saving ------------------------------------------------------------------


def hang_events(step_s: float = 1.0) -> list[dict[str, Any]]:
    """8 ranks: steps 1-100 of `step_s` from 10, a 2 s checkpoint, then no progress for 900 s until the failure."""
    w, run = 8, "hang"
    last = 10 + 100 * step_s
    out = [ev("run_submitted", 0, run), ev("allocation_start", 0, run, gpus=8)]
    out += [ev("attempt_start", 0, run, attempt=0, rank=r, world_size=w, host="h0") for r in range(w)]
    out += per_rank("resume", 0, w, run, attempt=0, step=0)
    out += steps(0, w, 1, 100, 10, dt=step_s, run_id=run)
    out += per_rank("checkpoint_start", last, w, run, attempt=0, step=100)
    out += per_rank("checkpoint_end", last + 2, w, run, attempt=0, step=100, ok=True)
    out += per_rank("attempt_end", last + 902, w, run, attempt=0, reason="failed")
    out += [ev("run_end", last + 902, run, status="failed"), ev("allocation_end", last + 902, run)]
    return out


@pytest.mark.parametrize(("step_s", "timeout_s", "minutes"), [(1.0, 300.0, 5), (45.0, 480.0, 8)])
def test_a_hang_names_the_timeout_setting_and_the_saving(step_s: float, timeout_s: float, minutes: int) -> None:
    ledger = build_ledger(run_data_from_events("hang", hang_events(step_s)))
    allocated = 8 * (10 + 100 * step_s + 902)
    assert ledger.waste_gpu_seconds["hang"] == pytest.approx(8 * 900)
    assert ledger.allocated_gpu_seconds == pytest.approx(allocated)
    rec = only(advise(ledger), "hang_timeout")
    # T = the largest of 5 min, 10 mean steps (10 s / 450 s -> 8 min) and 2 writes (4 s), in whole minutes
    assert rec.title == f"Lower the collective timeout to {fmt.duration(timeout_s)}"
    assert f"init_process_group(..., timeout=timedelta(minutes={minutes}))" in rec.wording
    assert rec.wording.startswith(f"1 hang lasted 15 min 00 s from the last step to the failure being torn down, "
                                  f"{gh(7200)} in all")
    saved = 8 * (900 - timeout_s)
    assert rec.gain.gpu_seconds == pytest.approx(saved)
    assert rec.gain.predicted_goodput == pytest.approx(8 * 100 * step_s / (allocated - saved))
    assert {e.key: e.value for e in rec.evidence}["timeout_seconds"] == timeout_s
    assert rec.prediction.startswith(f"Measured goodput {fmt.percent(ledger.goodput)} -> "
                                     f"{fmt.percent(8 * 100 * step_s / (allocated - saved))} if every hang ended "
                                     f"{fmt.duration(timeout_s)} after the last step")


def test_hangs_already_shorter_than_the_timeout_get_a_note_not_advice() -> None:
    ledger = finished(8_000.0, hang=480.0, failures=1, attempts=[attempt(failed=True, hang=480.0, productive=7520.0)])
    advice = advise(ledger)  # 60 s per hang, under the 5 min floor
    assert "hang_timeout" not in codes(advice)
    assert any(n.startswith("Hangs: 1 hang of at most 1 min 00 s each") for n in advice.notes)


def test_a_run_hung_now_comes_first_whatever_its_share() -> None:
    provisional = ProvisionalHang(hang_gpu_seconds=800.0, since=1000.0, as_of=1100.0, from_idle_gpu_seconds=0.0,
                                  added_allocated_gpu_seconds=800.0)
    ledger = finished(idle=30_000.0, hang=800.0, provisional=provisional, status="running", attempts=[attempt()])
    advice = advise(ledger)
    assert codes(advice)[0] == "hung_now"
    rec = advice.recommendations[0]
    assert rec.wording.startswith(f"No progress for 1 min 40 s ({gh(800)} so far")
    assert rec.gain.bound == "none" and rec.gain.predicted_goodput is None
    assert rec.prediction == f"No prediction: the hang grows by {gh(8 * 60)} every minute until the job " \
                             "is stopped."


# -- stragglers: rank and host ----------------------------------------------------------------------------------


def views_of(hosts: dict[int, str | None], flagged: list[int]) -> RunViews:
    """Views holding only what the straggler advice reads: the rank rows (rank, host) and the flagged ranks."""
    rows = [RankRow(rank=rank, host=host, steps=100, median_compute_s=1.5 if rank in flagged else 1.0,
                    p90_compute_s=1.0, mean_compute_s=1.0, straggler_gpu_seconds=0.0, is_straggler=rank in flagged)
            for rank, host in hosts.items()]
    heatmap = Heatmap(rank_labels=[], ranks_per_row=1, step_centers=[], step_edges=[], z=[])
    only_ranks: dict[str, Any] = {"ranks": RankCompute(
        rows=rows, rows_total=len(rows), rows_truncated=False, median_compute_s=1.0, heatmap=heatmap,
        compute_source="step duration minus collectives", straggler_ranks=flagged)}
    return RunViews.model_construct(**only_ranks)  # the rest of the views: not read by the advice


def test_the_straggler_run_names_rank_and_host_and_what_to_do() -> None:
    ledger = finished(straggler=5_000.0, straggler_gpu_seconds_by_rank={7: 4_000.0, 1: 1_000.0})
    rec = only(advise(ledger, views=views_of({7: "gpu-node-07", 1: "gpu-node-01"}, [7])), "straggler_rank")
    assert rec.title == "Drain host gpu-node-07 (rank 7)"
    assert rec.wording.startswith("Rank 7 on host gpu-node-07 was consistently slower than the other ranks and "
                                  f"carried 80.0% of the {gh(5_000)} the job spent waiting")
    for action in ("scontrol update nodename=gpu-node-07 state=drain", "kubectl cordon gpu-node-07",
                   "sbatch --exclude=gpu-node-07", "replace it"):
        assert action in rec.wording
    assert rec.gain.bound == "at_most" and rec.gain.gpu_seconds == 4_000.0
    assert rec.gain.predicted_goodput == pytest.approx(95_000 / 96_000)
    assert rec.prediction.startswith("Measured goodput 95.0% -> up to 99.0% if rank 7 on host gpu-node-07 kept pace")


def test_an_unflagged_rank_is_never_named() -> None:
    ledger = finished(straggler=5_000.0, straggler_gpu_seconds_by_rank={0: 2_950.0, 1: 2_050.0})
    rec = only(advise(ledger, views=views_of({0: "a", 1: "b"}, [])), "straggler_spread")
    assert "no rank was consistently slower" in rec.wording and "rank 0" not in rec.wording


def test_a_simulated_straggler_is_named_with_the_host_it_ran_on() -> None:
    result = simulate(SimConfig(run_id="slow", ranks=16, hours=0.2, mtbf_s=None, straggler_rank=11, seed=3))
    data = run_data_from_events("slow", result.events)
    ledger = build_ledger(data)
    views = build_run_views(data, ledger, version=1)
    host = next(r.host for r in views.ranks.rows if r.rank == 11)
    assert host and views.ranks.straggler_ranks == [11]  # the simulator's truth: rank 11 is the slow one
    rec = advise(ledger, views=views).recommendations[0]
    # its seven host-mates keep pace: the rank is the cause, not its host
    assert rec.code == "straggler_rank" and rec.title == f"Look at the GPU of rank 11 (host {host}): slower than the " \
                                                         "other ranks"
    assert "Drain" not in rec.wording and "drain" not in rec.wording


def test_a_host_is_drained_only_when_most_of_its_ranks_are_slow() -> None:
    hosts: dict[int, str | None] = {r: "node000" if r < 4 else "node001" for r in range(8)}
    ledger = finished(straggler=5_000.0, straggler_gpu_seconds_by_rank={4: 1_500.0, 5: 1_200.0, 6: 1_100.0,
                                                                        7: 1_000.0, 2: 200.0})
    rec = only(advise(ledger, views=views_of(hosts, [2, 4, 5, 6, 7])), "straggler_rank")
    assert rec.title == "Drain host node001 (rank 4, rank 5, rank 6, rank 7)"  # all four of its ranks are slow
    assert "scontrol update nodename=node001 state=drain" in rec.wording
    assert "node000" not in rec.title and "look at the GPU of rank 2 (host node000)" in rec.wording  # 1 of 4


def test_a_one_node_job_names_the_rank_never_its_host() -> None:
    ledger = finished(straggler=5_000.0, straggler_gpu_seconds_by_rank={1: 5_000.0})
    rec = only(advise(ledger, views=views_of({0: "vm", 1: "vm"}, [1])), "straggler_rank")
    assert rec.title == "Look at the GPU of rank 1 (host vm): slower than the other ranks"
    assert "drain" not in rec.wording.lower() and "kubectl cordon" not in rec.wording


# -- every run gets its top actions ---------------------------------------------------------------------------


def test_the_demos_biggest_run_gets_its_three_largest_costs_as_actions_with_their_stake() -> None:
    # the demo's 64-GPU run (scripts/demo.py): 5 failures; rework, startup and checkpoint each under 5%
    result = simulate(SimConfig(run_id="big", ranks=64, hours=2, mtbf_s=1800, checkpoint_every=200, seed=1))
    data = run_data_from_events("big", result.events)
    ledger = build_ledger(data)
    waste = ledger.waste_gpu_seconds
    shares = {c: waste[c] / ledger.allocated_gpu_seconds for c in ("rework", "startup", "checkpoint")}
    assert ledger.failures == 5 and all(0.03 < v < 0.05 for v in shares.values())  # every one under its threshold
    advice = advise(ledger, views=build_run_views(data, ledger, version=1))
    top = advice.recommendations[:3]
    largest = sorted(("rework", "startup", "checkpoint"), key=lambda c: -waste[c])
    assert [r.category for r in top] == largest
    assert [r.at_stake_gpu_seconds for r in top] == [waste[c] for c in largest]
    assert [r.code for r in top] == ["checkpoint_interval", "startup", "checkpoint_async"]
    for rec in top:  # each says plainly that its saving is small
        assert rec.small is not None and rec.small.startswith("Small: ")
    assert only(advice, "startup").small == (f"Small: startup is {fmt.percent(shares['startup'])} of the allocation, "
                                             "under the 5.0% from which this advice is material.")


def test_an_amount_at_stake_never_exceeds_its_own_category() -> None:
    # checkpointing more often acts on rework: its stake is the rework, not rework + checkpoint
    ledger = finished(36_000.0, checkpoint=1_000.0, rework=6_000.0, failures=4, allocated_wall_seconds=4_500.0,
                      checkpoints=checkpoints(10.0, 1_210.0), attempts=[attempt(world=8, end=4_500.0)])
    rec = only(advise(ledger), "checkpoint_interval")
    assert rec.title.startswith("Checkpoint more often")
    assert (rec.category, rec.at_stake_gpu_seconds) == ("rework", 6_000.0)


def test_small_actions_past_the_top_three_become_notes_and_material_ones_always_show() -> None:
    ledger = finished(startup=100.0, checkpoint=200.0, straggler=300.0, idle=400.0, hang=0.0,
                      attempts=[attempt(startup=100.0)], checkpoints=checkpoints(10.0, 600.0))
    advice = advise(ledger)
    assert codes(advice) == ["idle_gaps", "straggler_spread", "checkpoint_async"]  # the 3 largest, all small
    assert all(r.small for r in advice.recommendations)
    (note,) = [n for n in advice.notes if n.startswith("Shorten the time to the first step")]
    assert note == ("Shorten the time to the first step: at stake 1.7 GPU-min (startup). Small: startup is 0.1% of "
                    "the allocation, under the 5.0% from which this advice is material.")
    material = finished(startup=6_000.0, checkpoint=200.0, straggler=300.0, idle=400.0,
                        attempts=[attempt(startup=6_000.0)], checkpoints=checkpoints(10.0, 600.0))
    shown = advise(material)
    assert codes(shown)[0] == "startup" and only(shown, "startup").small is None  # 6% >= 5%: material
    assert len(shown.recommendations) == 3


def test_a_run_with_no_waste_says_there_is_nothing_to_act_on() -> None:
    advice = advise(finished())
    assert advice.recommendations == []
    assert fmt.no_advice(advice.measured) == "Nothing to act on: the run wasted no GPU time."


# -- the rest of the levers -------------------------------------------------------------------------------------


def test_restart_cost_and_async_checkpoints_are_upper_bounds() -> None:
    ledger = finished(startup=9_000.0, checkpoint=7_000.0, failures=2,
                      checkpoints=checkpoints(20.0, 520.0), allocated_wall_seconds=3600.0,
                      attempts=[attempt(0, startup=3_000.0), attempt(1, startup=4_000.0),
                                attempt(2, startup=2_000.0)])
    advice = advise(ledger)
    startup = only(advice, "startup")
    assert startup.gain.bound == "at_most" and startup.gain.gpu_seconds == 6_000.0  # the restarts' startups
    # 8 GPUs: 3,000 / 8 = 375 s first; (4,000 + 2,000) / 8 / 2 = 375 s per restart
    assert "375 s" not in startup.wording and "warm spares" in startup.wording
    assert "6 min 15 s before the first step, then 6 min 15 s per restart over 2 restarts" in startup.wording
    ck = only(advice, "checkpoint_async")
    assert ck.gain.gpu_seconds == 7_000.0 and ck.prediction.startswith("Measured goodput 84.0% -> up to ")
    assert codes(advice)[:2] == ["startup", "checkpoint_async"]  # the most GPU-seconds at stake first


def test_a_flagged_resume_check_is_advice_without_a_goodput_prediction() -> None:
    finding = Finding(code="loss_mismatch", attempt=1, message="attempt 1 resumed from step 10; losses differ",
                      ranks=[0], steps=[11], evidence={}, examples=[])
    check = ResumeCheck(run_id="r", version=1, verdict="flagged", findings=[finding], resumes=[], notes=[],
                        config=Tolerances(**asdict(ResumeCheckConfig())),
                        gpu_seconds_since_first_finding=400.0)
    rec = only(advise(finished(), resume_check=check), "resume_correctness")
    assert rec.at_stake_gpu_seconds == 400.0 and rec.gain.bound == "none"
    assert "loss_mismatch" in rec.wording and "attempt 1 resumed from step 10" in rec.wording
    assert rec.prediction.startswith("No goodput prediction: this is about correctness")


def test_an_unverified_resume_check_is_advice_to_check_resumes_as_they_load() -> None:
    reason = "attempt 1 resumed from step 250: no recomputed step and no digest at load arrived"
    unchecked = ResumeSummary(attempt=1, resume_step=250, resume_reported=True, checkpoint_attempt=0,
                              reference_attempts=[0], recomputed_steps=0, compared={"loss": 0, "digest_at_load": 0},
                              ok=True, verified=False, unverified_reason=reason)
    check = ResumeCheck(run_id="r", version=1, verdict="unverified", reason=reason, findings=[], resumes=[unchecked],
                        notes=[], config=Tolerances(**asdict(ResumeCheckConfig())),
                        gpu_seconds_since_first_finding=0.0, gpu_seconds_since_first_unverified=300.0)
    rec = only(advise(finished(), resume_check=check), "resume_correctness")
    assert rec.title == "Check each resume as it loads" and rec.at_stake_gpu_seconds == 300.0
    assert rec.wording.startswith(f"1 restart loaded a checkpoint and nothing could be compared: {reason}.")
    assert "tracker.resumed(step, checkpoint_step=..., digest=...)" in rec.wording and rec.gain.bound == "none"
    ok = check.model_copy(update={"verdict": "ok", "reason": None})
    assert "resume_correctness" not in codes(advise(finished(), resume_check=ok))


def test_long_queueing_is_said_with_no_gpu_time_at_stake() -> None:
    allocations = [Allocation(start=5000.0, end=6000.0, gpus=8, open=False, reported=True),
                   Allocation(start=9000.0, end=11000.0, gpus=8, open=False, reported=True)]
    rec = only(advise(finished(queue_seconds=8000.0, allocated_wall_seconds=3000.0, allocations=allocations)),
               "queue")
    assert rec.at_stake_gpu_seconds == 0.0 and rec.gain.bound == "none"
    assert rec.wording.startswith("The run waited 2 h 13 min for the scheduler, 72.7% of the time from submission "
                                  "to the end of its allocation; 50 min 00 s of it in 1 requeue.")
    assert "torchrun --max-restarts" in rec.wording


def test_nothing_allocated_gives_no_advice() -> None:
    assert advise(finished(0.0)).recommendations == []


@pytest.mark.parametrize("kwargs", [
    {"mtbf_s": 900, "straggler_rank": 2, "hang_at_step": 200},
    {"mtbf_s": 600, "gpus": 12, "checkpoint_every": 400, "end": "failed"},
    {"mtbf_s": None, "checkpoint_every": 20, "checkpoint_s": 15},
    {"mtbf_s": 600, "checkpoint_every": 50, "startup_s": 200},
])
def test_every_prediction_is_of_the_measured_run_and_no_stake_exceeds_its_category(kwargs: dict[str, Any]) -> None:
    result = simulate(SimConfig(run_id="sim", ranks=8, hours=0.3, seed=7, **kwargs))
    data = run_data_from_events("sim", result.events)
    ledger = build_ledger(data)
    advice = advise(ledger, views=build_run_views(data, ledger, version=1))
    assert advice.recommendations
    waste = ledger.allocated_gpu_seconds - ledger.productive_gpu_seconds
    for rec in advice.recommendations:
        if rec.category in WASTE_KEYS:
            assert 0 < rec.at_stake_gpu_seconds <= ledger.waste_gpu_seconds[rec.category], rec.code
        gain = rec.gain
        assert gain.measured_goodput == ledger.goodput
        if gain.bound == "none":
            continue
        assert gain.gpu_seconds is not None and 0 <= gain.gpu_seconds <= waste * (1 + 1e-12)
        assert gain.predicted_goodput == pytest.approx(
            ledger.productive_gpu_seconds / (ledger.allocated_gpu_seconds - gain.gpu_seconds), rel=1e-12)
        assert rec.prediction.startswith(f"Measured goodput {fmt.percent(ledger.goodput)} -> ")
    stakes = [r.at_stake_gpu_seconds for r in advice.recommendations]
    assert stakes == sorted(stakes, reverse=True)


def test_the_config_names_a_bad_field() -> None:
    with pytest.raises(ValueError, match="hang_share must be in"):
        AdviceConfig(hang_share=2.0)


def test_the_docs_worked_hang_example_to_the_digit() -> None:
    ledger = build_ledger(run_data_from_events("hang", hang_events(1.0)))
    docs = (Path(__file__).resolve().parents[2] / "docs" / "advice.md").read_text().replace("\n  ", " ")
    assert only(advise(ledger), "hang_timeout").prediction in docs
