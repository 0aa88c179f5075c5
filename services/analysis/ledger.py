"""The waste ledger: every allocated GPU-second of a run goes to exactly one category.

Rules (docs/ledger.md explains them with the reference scenario):
- allocated: sum over allocations of (end - start) x gpus; with no allocation events, attempt spans x world size.
- wall time inside the allocations is painted by claims (services.analysis.claims), strongest first:
  kept step > reworked step > checkpoint write > eval > hang > startup; between two claims of one kind, the later
  attempt's; what no claim covers is idle.
- eval (validation between steps, reported as a phase) is neither productive nor waste: productive + waste + eval
  = allocated.
- hang: a failed attempt's last step end to its end, and its teardown (its end to its allocation's end) when
  no attempt follows in that allocation; a following attempt's startup claims the time after a failure.
- a claim of an attempt counts on min(world size, allocated GPUs) GPUs; the other allocated GPUs are idle.
- straggler is carved out of kept-step time: per kept step, (slowest rank's compute - median rank's compute)
  x world size, compute = step duration - time inside collectives.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from services.analysis.attempts import Attempt, RunStructure, build_run_structure
from services.analysis.claims import CLAIM_CATEGORY, Claim, RunPainting, paint_run
from services.analysis.run_data import RunData
from services.analysis.startup_parts import build_startup_parts
from services.analysis.stragglers import rank_compute, step_straggle, summary_straggle
from services.analysis.usage import usage_of_painting
from services.schemas.categories import EVAL, PRODUCTIVE, WASTE_KEYS, RunStatus, WasteCategory
from services.schemas.ledger import (
    Allocation,
    AttemptLedger,
    CheckpointSummary,
    Ledger,
    RunningTail,
    StepSummary,
    WasteBreakdown,
    goodput_ratio,
)


def build_ledger(data: RunData, painting: RunPainting | None = None) -> Ledger:
    """Attribute every allocated GPU-second of the run to productive time or exactly one waste category.

    `painting`: the data's painted structure when the caller already built it (the views read the same one)."""
    painting = paint_run(build_run_structure(data)) if painting is None else painting
    run, job_steps = painting.run, painting.job_steps
    attempts = run.attempts

    lengths = painting.lengths
    gpus = painting.gpus.astype(np.float64)
    claimed = painting.claim >= 0
    pos = painting.position
    world = np.array([a.world_size for a in attempts], dtype=np.float64) if attempts else np.zeros(1)
    on_gpus = np.where(claimed, np.minimum(world[pos], gpus), 0.0)
    claimed_gpu_s = lengths * on_gpus
    idle_gpu_s = lengths * (gpus - on_gpus)

    totals = {key: 0.0 for key in (*WASTE_KEYS, PRODUCTIVE, EVAL)}
    per_attempt: list[dict[str, float]] = [{} for _ in attempts]
    for claim, category in CLAIM_CATEGORY.items():
        sel = painting.claim == claim
        totals[category] = float(claimed_gpu_s[sel].sum())
        for i in range(len(attempts)):
            value = float(claimed_gpu_s[sel & (pos == i)].sum())
            if value:
                per_attempt[i][category] = value
    totals[WasteCategory.IDLE.value] = float(idle_gpu_s.sum())
    allocated = float((lengths * gpus).sum())

    straggler_total, by_rank, straggle = _straggler(data, job_steps, run, totals[PRODUCTIVE])
    productive = totals[PRODUCTIVE] - straggler_total
    waste = {key: totals[key] for key in WASTE_KEYS}
    waste[WasteCategory.STRAGGLER.value] = straggler_total

    at_risk = _at_risk(painting, claimed_gpu_s)
    failures = sum(1 for a in attempts if a.failed)
    wall = float(sum(a.end - a.start for a in run.allocations))
    return Ledger(
        run_id=run.run_id,
        status=run.status.value,
        allocated_gpu_seconds=allocated,
        productive_gpu_seconds=productive,
        waste_gpu_seconds=WasteBreakdown(**waste),
        eval_gpu_seconds=totals[EVAL],
        goodput=goodput_ratio(productive, allocated),
        queue_seconds=_queue_seconds(run),
        allocated_wall_seconds=wall,
        at_risk_gpu_seconds=at_risk,
        restarts=max(len(attempts) - 1, 0),
        failures=failures,
        mtbf_seconds=(wall / failures) if failures else None,
        checkpoints=_checkpoint_summary(run),
        steps=_step_summary(job_steps),
        straggler_gpu_seconds_by_rank=by_rank,
        attempts=[_attempt_ledger(a, job_steps, per_attempt[i]) for i, a in enumerate(attempts)],
        first_time=run.first_time,
        latest_time=run.latest_time,
        allocations=[Allocation(start=a.start, end=a.end, gpus=a.gpus, open=a.open, reported=run.allocations_reported)
                     for a in run.allocations],
        running_tail=_running_tail(painting),
        startup_parts=build_startup_parts(painting),
        usage=usage_of_painting(painting, claimed_gpu_s, idle_gpu_s, straggle, straggler_total),
        clocks=list(run.clocks),
    )


def _straggler(
    data: RunData, job_steps: pd.DataFrame, run: RunStructure, kept_gpu_s: float
) -> tuple[float, dict[int, float], pd.DataFrame]:
    """(total straggler GPU-seconds, per rank, per kept step: attempt, step, cost)."""
    none = pd.DataFrame(columns=["attempt", "step", "cost"])
    summary = data.step_summary
    if summary is not None:
        if summary.empty or job_steps.empty:
            return 0.0, {}, none
        stats = summary_straggle(summary.straggle, job_steps["kept"].to_numpy(bool), gpus_counted(run))
    else:
        if run.steps.empty or job_steps.empty:
            return 0.0, {}, none
        compute = rank_compute(run, data, job_steps.loc[job_steps["kept"]])
        stats = step_straggle(run, compute, gpus_counted(run))
    if stats.empty:
        return 0.0, {}, none
    total = float(stats["cost"].sum())
    by_rank_series = stats.groupby("rank")["cost"].sum()
    if total > kept_gpu_s > 0:  # steps overlapping in time: never carve out more than the kept time
        by_rank_series *= kept_gpu_s / total
        total = kept_gpu_s
    by_rank = {int(r): float(v) for r, v in zip(by_rank_series.index.to_numpy(np.int64),
                                                  by_rank_series.to_numpy(np.float64), strict=True) if v > 0}
    return total, by_rank, stats


def gpus_counted(run: RunStructure) -> dict[int, int]:
    """Per attempt, the GPUs its time counts on: min(world size, GPUs of the allocation it started in)."""
    return {a.attempt: min(a.world_size, _gpus_at(run, a)) for a in run.attempts}


def _gpus_at(run: RunStructure, attempt: Attempt) -> int:
    for alloc in run.allocations:
        if alloc.start <= attempt.start <= alloc.end:
            return alloc.gpus
    return attempt.world_size


def _at_risk(painting: RunPainting, claimed_gpu_s: np.ndarray) -> float:
    """A running run's kept work since its last saved state: lost if it failed now. Only the last attempt that
    resumed or stepped holds such work: the steps of the attempts before it above its resume step are rework."""
    run, job_steps = painting.run, painting.job_steps
    if run.status is not RunStatus.RUNNING or not run.attempts or job_steps.empty:
        return 0.0
    pos, saved = run.saved_state()
    unsaved = job_steps[(job_steps["pos"] == pos) & job_steps["kept"] & (job_steps["step"] > saved)]
    if unsaved.empty:
        return 0.0
    t0 = float(unsaved["start"].min())
    sel = (painting.claim == Claim.KEPT) & (painting.position == pos) & (painting.bounds[:-1] >= t0)
    return float(claimed_gpu_s[sel].sum())


def _running_tail(painting: RunPainting) -> RunningTail | None:
    """Of a running run: the stretch at the end of its last allocation that no claim covers."""
    run = painting.run
    if run.status is not RunStatus.RUNNING or not run.allocations:
        return None
    last = max(run.allocations, key=lambda a: (a.end, a.start))
    bounds = painting.bounds
    lo = int(np.searchsorted(bounds, last.start, side="left"))
    hi = int(np.searchsorted(bounds, last.end, side="left"))
    claimed = np.flatnonzero(painting.claim[lo:hi] >= 0)
    since = float(bounds[lo + int(claimed[-1]) + 1]) if len(claimed) else float(last.start)
    gpus = min(run.attempts[-1].world_size, last.gpus) if run.attempts else last.gpus
    return RunningTail(since=min(since, float(last.end)), until=float(last.end), gpus=int(gpus),
                       allocated_gpus=int(last.gpus), grows=bool(last.open or not run.allocations_reported))


def _queue_seconds(run: RunStructure) -> float:
    allocs = sorted(run.allocations, key=lambda a: a.start) if run.allocations_reported else []
    if not allocs:
        return 0.0
    queue = max(allocs[0].start - run.submitted, 0.0) if run.submitted is not None else 0.0
    for prev, nxt in itertools.pairwise(allocs):
        queue += max(nxt.start - prev.end, 0.0)
    return float(queue)


def _checkpoint_summary(run: RunStructure) -> CheckpointSummary:
    ck = run.checkpoints
    if ck.empty:
        return CheckpointSummary(count=0, ok=0, failed=0, torn=0, median_blocking_seconds=None,
                                 median_interval_seconds=None, median_interval_steps=None, last_ok_step=None)
    blocking = (ck["end"] - ck["start"]).to_numpy()
    intervals_s: list[float] = []
    intervals_steps: list[float] = []
    for _, group in ck.sort_values("start").groupby("attempt"):
        intervals_s.extend(np.diff(group["start"].to_numpy()).tolist())
        intervals_steps.extend(np.diff(group["step"].to_numpy(dtype=np.float64)).tolist())
    ok = ck[ck["ok"] == True]  # noqa: E712
    return CheckpointSummary(
        count=len(ck),
        ok=len(ok),
        failed=int(((ck["ok"] == False) & (ck["torn"] == False)).sum()),  # noqa: E712
        torn=int((ck["torn"] == True).sum()),  # noqa: E712
        median_blocking_seconds=float(np.median(blocking)),
        median_interval_seconds=float(np.median(intervals_s)) if intervals_s else None,
        median_interval_steps=float(np.median(intervals_steps)) if intervals_steps else None,
        last_ok_step=int(ok["step"].max()) if not ok.empty else None,
    )


def _step_summary(job_steps: pd.DataFrame) -> StepSummary:
    if job_steps.empty:
        return StepSummary(furthest=None, kept=0, reworked=0, computed=0)
    kept = int(job_steps["kept"].sum())
    return StepSummary(furthest=int(job_steps["step"].max()), kept=kept, reworked=int(len(job_steps) - kept),
                       computed=len(job_steps))


def _attempt_ledger(a: Attempt, job_steps: pd.DataFrame, gpu_seconds: dict[str, float]) -> AttemptLedger:
    mine = job_steps[job_steps["attempt"] == a.attempt] if not job_steps.empty else job_steps
    kept = int(mine["kept"].sum()) if not mine.empty else 0
    return AttemptLedger(
        attempt=a.attempt, start=a.start, end=a.end, end_reported=a.end_reported, reason=a.reason,
        failed=a.failed, world_size=a.world_size, hosts=list(a.hosts), resume_step=a.resume_step,
        resume_reported=a.resume_reported, first_step=a.first_step, last_step=a.last_step,
        steps_kept=kept, steps_reworked=int(len(mine) - kept), gpu_seconds=gpu_seconds,
    )
