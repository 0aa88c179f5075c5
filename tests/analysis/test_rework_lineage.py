"""Rework follows the run's surviving lineage (docs/ledger.md, "Rework"; issue 30, point 8): a step is kept when
its result is in the state the run ends with, and a run that failed for good ends with the latest checkpoint of
that lineage, whatever its last attempts did (restarts that died before `init()` report no resume step).

The reference is a model of the job's state, not of the ledger's rule: each attempt loads a checkpoint (its state:
which attempt computed each step) and drops the newer ones it passed over (unreadable, or written by work it
threw away), computes its steps on top and saves what it checkpoints. The run's final state is the last attempt's
that stepped, or, for a run that failed for good, the newest checkpoint left: what a relaunch would load. A step is
kept when the final state holds it; every other step computed is rework.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.analysis.scenarios import ev, per_rank, steps
from tests.ledger_checks import ledger_of_events

STEP_S, CKPT_S = 1.0, 0.5

KINDS = ["steps", "dies before init", "resumes, then dies"]


@dataclass
class JobModel:
    """The job's state as the attempts leave it: `state` maps each step of the model in memory to the attempt that
    computed it; `saved` maps a checkpoint's step to the state it holds."""

    state: dict[int, int] = field(default_factory=dict)
    saved: dict[int, dict[int, int]] = field(default_factory=dict)
    computed: dict[tuple[int, int], float] = field(default_factory=dict)  # (attempt, step) -> seconds

    def resume(self, step: int) -> None:
        self.state = dict(self.saved.get(step, {}))
        self.saved = {s: held for s, held in self.saved.items() if s <= step}  # the newer ones were passed over

    def step(self, attempt: int, step: int) -> None:
        self.state[step] = attempt
        self.computed[(attempt, step)] = STEP_S

    def checkpoint(self, step: int) -> None:
        self.saved[step] = {s: a for s, a in self.state.items() if s <= step}

    def relaunch_state(self) -> dict[int, int]:
        return dict(self.saved[max(self.saved)]) if self.saved else {}


@dataclass
class Run:
    events: list[dict[str, Any]]
    world: int
    status: str
    kept: set[tuple[int, int]]
    reworked: set[tuple[int, int]]
    at_risk: set[tuple[int, int]]  # kept now, thrown away if the run failed now (a running run)


@st.composite
def runs(draw: st.DrawFn) -> Run:
    world = draw(st.integers(1, 3))
    status = draw(st.sampled_from(["failed", "finished", "running"]))
    n = draw(st.integers(1, 6))
    kinds = [draw(st.sampled_from(KINDS)) for _ in range(n)]
    if status == "finished":
        kinds[-1] = "steps"
    elif status == "failed" and draw(st.booleans()):  # the restarts after the last stepping one die before init
        kinds += ["dies before init"] * draw(st.integers(1, 3))
        n = len(kinds)
    job = JobModel()
    t = 0.0
    events = [ev("allocation_start", t, gpus=world)]
    for k, kind in enumerate(kinds):
        events += [ev("attempt_start", t, attempt=k, rank=r, world_size=world, host="h") for r in range(world)]
        t += 1.0
        if kind != "dies before init":
            options = [0, *sorted(job.saved)]
            resume = draw(st.sampled_from(options)) if draw(st.integers(0, 3)) == 0 else options[-1]
            job.resume(resume)
            if kind != "steps" or draw(st.booleans()):  # else inferred from its first step
                events += per_rank("resume", t, world, attempt=k, step=resume)
            if kind == "steps":
                t = _steps(draw, job, events, k, world, resume, t)
        last = k == n - 1
        reason = "completed" if last and status == "finished" else "failed"
        if not (last and status == "running") and (reason == "completed" or draw(st.booleans())):
            events += per_rank("attempt_end", t, world, attempt=k, reason=reason)  # else killed without a word
        t += 2.0
    if status != "running":
        events += [ev("run_end", t, status=status), ev("allocation_end", t + 1.0)]
    final = job.relaunch_state() if status == "failed" else job.state
    kept = {(a, s) for s, a in final.items()}
    at_risk = kept - {(a, s) for s, a in job.relaunch_state().items()} if status == "running" else set()
    return Run(events=events, world=world, status=status, kept=kept, reworked=set(job.computed) - kept,
               at_risk=at_risk)


def _steps(draw: st.DrawFn, job: JobModel, events: list[dict[str, Any]], attempt: int, world: int, resume: int,
           t: float) -> float:
    """Steps resume+1.. back to back, with checkpoints (completed ok, failed or torn) after some of them."""
    count = draw(st.integers(1, 25))
    every = draw(st.integers(2, 8))
    first = resume + 1
    for s in range(resume + 1, resume + count + 1):
        job.step(attempt, s)
        if s % every == 0 or s == resume + count:
            events += steps(attempt, world, first, s, t, dt=STEP_S)
            t += (s - first + 1) * STEP_S
            first = s + 1
            outcome = draw(st.sampled_from(["none", "ok", "ok", "failed", "torn"])) if s % every == 0 else "none"
            if outcome != "none":
                events += per_rank("checkpoint_start", t, world, attempt=attempt, step=s)
                t += CKPT_S
                if outcome != "torn":
                    events += per_rank("checkpoint_end", t, world, attempt=attempt, step=s, ok=outcome == "ok")
                if outcome == "ok":
                    job.checkpoint(s)
    return t


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs())
def test_kept_and_reworked_steps_follow_the_surviving_lineage(run: Run) -> None:
    ledger = ledger_of_events(run.events)  # the partition is checked there
    assert ledger.status == run.status
    assert (ledger.steps.kept, ledger.steps.reworked) == (len(run.kept), len(run.reworked))
    for a in ledger.attempts:
        assert (a.steps_kept, a.steps_reworked) == (
            sum(1 for k, _ in run.kept if k == a.attempt), sum(1 for k, _ in run.reworked if k == a.attempt)), a
    # the steps do not overlap in time: each kept step is productive, each reworked one rework, on every GPU
    assert ledger.productive_gpu_seconds == pytest.approx(len(run.kept) * STEP_S * run.world)
    assert ledger.waste_gpu_seconds["rework"] == pytest.approx(len(run.reworked) * STEP_S * run.world)
    assert ledger.at_risk_gpu_seconds == pytest.approx(len(run.at_risk) * STEP_S * run.world)


def test_a_run_that_failed_for_good_after_restarts_that_never_stepped_keeps_its_last_checkpoint() -> None:
    """Issue 30, point 8, by hand: checkpoints at 20 and 40, killed after step 57; two restarts die before
    `init()` (no resume, no step) and the job gives up. A relaunch would resume from 40: 40 kept, 41-57 rework."""
    w = 2
    events = [ev("allocation_start", 0, gpus=w)]
    events += [ev("attempt_start", 0, attempt=0, rank=r, world_size=w, host="h") for r in range(w)]
    events += per_rank("resume", 0, w, attempt=0, step=0)
    events += steps(0, w, 1, 20, 5)
    events += per_rank("checkpoint_start", 25, w, attempt=0, step=20)
    events += per_rank("checkpoint_end", 26, w, attempt=0, step=20, ok=True)
    events += steps(0, w, 21, 40, 26)
    events += per_rank("checkpoint_start", 46, w, attempt=0, step=40)
    events += per_rank("checkpoint_end", 47, w, attempt=0, step=40, ok=True)
    events += steps(0, w, 41, 57, 47)  # to 64; SIGKILLed: no attempt_end
    for k, t in ((1, 70), (2, 80)):
        events += [ev("attempt_start", t, attempt=k, rank=r, world_size=w, host="h") for r in range(w)]
        events += per_rank("attempt_end", t + 3, w, attempt=k, reason="failed")
    events += [ev("run_end", 84, status="failed"), ev("allocation_end", 85)]
    ledger = ledger_of_events(events)
    assert (ledger.steps.kept, ledger.steps.reworked) == (40, 17)
    assert ledger.productive_gpu_seconds == pytest.approx(40 * w)
    assert ledger.waste_gpu_seconds["rework"] == pytest.approx(17 * w)
