"""The ledger's claims on a run's wall time, painted once per run structure: the ledger counts the painting, the
dashboard's views draw it.

Claims, strongest first (docs/ledger.md, "Painting wall time"): kept step > reworked step > checkpoint write
> eval > hang > startup; what no claim covers is idle. Where two claims of one kind overlap (steps, checkpoint
writes or startups of two attempts overlapping in time), the later attempt's claim wins: the piece counts on its
GPUs and in its per-attempt figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import pandas as pd

from services.analysis.attempts import RunStructure
from services.analysis.painting import paint
from services.schemas.categories import EVAL, PRODUCTIVE, RunStatus, WasteCategory


class Claim(IntEnum):
    """What a piece of wall time was spent on; where claims overlap, the larger value wins."""

    STARTUP = 0
    HANG = 1
    EVAL = 2
    CHECKPOINT = 3
    REWORK = 4
    KEPT = 5


CLAIM_CATEGORY: dict[Claim, str] = {
    Claim.STARTUP: WasteCategory.STARTUP.value,
    Claim.HANG: WasteCategory.HANG.value,
    Claim.EVAL: EVAL,
    Claim.CHECKPOINT: WasteCategory.CHECKPOINT.value,
    Claim.REWORK: WasteCategory.REWORK.value,
    Claim.KEPT: PRODUCTIVE,
}
UNCLAIMED = -1


@dataclass(frozen=True, slots=True)
class _Precedence:
    """The one integer per claim that painting compares (the larger wins where claims overlap): ordered by the
    claim's strength, then, between claims of one kind, by its attempt's position: the later attempt wins."""

    attempts: int

    def key(self, claim: Claim, position: np.ndarray | int) -> np.ndarray:
        return int(claim) * self.attempts + np.asarray(position, dtype=np.int64)

    def claim(self, key: np.ndarray) -> np.ndarray:
        return np.where(key >= 0, key // self.attempts, UNCLAIMED)

    def position(self, key: np.ndarray) -> np.ndarray:
        return np.where(key >= 0, key % self.attempts, 0)


@dataclass(frozen=True, slots=True)
class RunPainting:
    """The allocated wall time of `run` split into segments [bounds[i], bounds[i + 1]), each with the GPUs
    allocated over it (0 outside every allocation) and the claim that won it."""

    run: RunStructure
    job_steps: pd.DataFrame  # run.job_steps with `pos` (the attempt's position in run.attempts) and `kept`
    bounds: np.ndarray
    gpus: np.ndarray
    claim: np.ndarray  # the winning Claim of each segment, UNCLAIMED where none covers it (idle)
    position: np.ndarray  # the position of the winning claim's attempt (0 where unclaimed)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)


def paint_run(run: RunStructure) -> RunPainting:
    """The run's wall time painted with the ledger's claims: build it once, hand it to `build_ledger` and
    `build_run_views`."""
    job_steps = kept_job_steps(run)
    precedence = _Precedence(attempts=max(len(run.attempts), 1))
    starts, ends, keys = _claims(run, job_steps, precedence)
    painted = paint(
        np.array([a.start for a in run.allocations], dtype=np.float64),
        np.array([a.end for a in run.allocations], dtype=np.float64),
        np.array([a.gpus for a in run.allocations], dtype=np.int64),
        starts, ends, keys,
    )
    return RunPainting(run=run, job_steps=job_steps, bounds=painted.bounds, gpus=painted.base,
                       claim=precedence.claim(painted.key), position=precedence.position(painted.key))


def kept_job_steps(run: RunStructure) -> pd.DataFrame:
    """The run's job steps with the position of their attempt (`pos`) and whether their result was kept."""
    job_steps = run.job_steps.copy()
    position = {a.attempt: i for i, a in enumerate(run.attempts)}
    job_steps["pos"] = job_steps["attempt"].map(position).astype(np.int64) if not job_steps.empty else []
    job_steps["kept"] = _kept_mask(run, job_steps)
    return job_steps


def _kept_mask(run: RunStructure, job_steps: pd.DataFrame) -> np.ndarray:
    """A step of attempt k is kept unless some later attempt (or, for a run that failed for good, the newest saved
    state of its surviving lineage) resumed from below it: that rollback threw the step's result away."""
    if job_steps.empty:
        return np.zeros(0, dtype=bool)
    points = _resume_points(run)
    bound_after = np.full(len(run.attempts), np.inf)
    running = np.inf
    for i in range(len(points) - 1, -1, -1):
        if i < len(run.attempts):
            bound_after[i] = running
        running = min(running, points[i])
    bounds = bound_after[job_steps["pos"].to_numpy()]
    kept: np.ndarray = job_steps["step"].to_numpy(dtype=np.float64) <= bounds
    return kept


def _resume_points(run: RunStructure) -> list[float]:
    """The step each attempt's successor state starts from; +inf where nothing constrains it."""
    points = [float(a.resume_step) if a.resume_step is not None else np.inf for a in run.attempts]
    if run.status is RunStatus.FAILED and run.attempts:
        points.append(run.saved_state()[1])  # the state a relaunch would resume from
    return points


def _claims(run: RunStructure, job_steps: pd.DataFrame,
            precedence: _Precedence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    keys: list[np.ndarray] = []

    def add(start: np.ndarray | float, end: np.ndarray | float, claim: Claim, position: np.ndarray | int) -> None:
        s = np.atleast_1d(np.asarray(start, dtype=np.float64))
        starts.append(s)
        ends.append(np.atleast_1d(np.asarray(end, dtype=np.float64)))
        keys.append(np.broadcast_to(precedence.key(claim, position), s.shape))

    if not job_steps.empty:
        kept = job_steps["kept"].to_numpy()
        for claim, sel in ((Claim.KEPT, kept), (Claim.REWORK, ~kept)):
            part = job_steps[sel]
            add(part["start"].to_numpy(), part["end"].to_numpy(), claim, part["pos"].to_numpy())
    ck = run.checkpoints
    if not ck.empty:
        position = {a.attempt: i for i, a in enumerate(run.attempts)}
        add(ck["start"].to_numpy(), ck["end"].to_numpy(), Claim.CHECKPOINT,
            ck["attempt"].map(position).to_numpy(dtype=np.int64))
    ev = run.evals
    if not ev.empty:
        position = {a.attempt: i for i, a in enumerate(run.attempts)}
        add(ev["start"].to_numpy(), ev["end"].to_numpy(), Claim.EVAL,
            ev["attempt"].map(position).to_numpy(dtype=np.int64))
    alloc_starts = sorted(a.start for a in run.allocations)
    for i, a in enumerate(run.attempts):
        if a.failed and a.last_step_end is not None and a.end > a.last_step_end:
            add(a.last_step_end, a.end, Claim.HANG, i)
        waiting = _waiting_since(run, i)
        if waiting is not None and a.failed and a.end > waiting:
            add(waiting, a.end, Claim.HANG, i)  # waited for peers that never came: failure detection, as a hang
        if a.failed and (teardown_end := _teardown_end(run, i)) is not None:
            add(a.end, teardown_end, Claim.HANG, i)  # detected, torn down, no attempt follows: still failure cost
        # Startup: from the allocation start, or the previous attempt's end, to this attempt's first step.
        begin_candidates = [t for t in alloc_starts if t <= a.start]
        begin = begin_candidates[-1] if begin_candidates else a.start
        if i > 0:
            begin = max(begin, run.attempts[i - 1].end)
        finish = a.first_step_start if a.first_step_start is not None else a.end
        if waiting is not None:
            finish = min(finish, waiting)  # startup ends where the wait for peers begins
        if finish > begin:
            add(begin, finish, Claim.STARTUP, i)
    if not starts:
        empty = np.zeros(0)
        return empty, empty, np.zeros(0, dtype=np.int64)
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(keys)


def _waiting_since(run: RunStructure, i: int) -> float | None:
    """When attempt `i`'s ranks began waiting in an `init_process_group` that did not succeed, if it never stepped
    and failed, or is the running run's current attempt (its wait goes on: what follows is its running tail)."""
    a = run.attempts[i]
    since = run.init_waits.get(a.attempt)
    if since is None or a.first_step_start is not None:
        return None
    running = run.status is RunStatus.RUNNING and i == len(run.attempts) - 1 and not a.end_reported
    if not (a.failed or running):
        return None
    return min(max(since, a.start), a.end)


def _teardown_end(run: RunStructure, i: int) -> float | None:
    """Where the teardown of failed attempt `i` ends when no attempt follows it in its allocation: that
    allocation's end (None when the next attempt starts inside it: its startup claims the time)."""
    end = run.attempts[i].end
    holding = [alloc for alloc in run.allocations if alloc.start <= end < alloc.end]
    if not holding:
        return None
    alloc_end = max(alloc.end for alloc in holding)
    following = run.attempts[i + 1].start if i + 1 < len(run.attempts) else None
    if following is not None and following < alloc_end:
        return None
    return alloc_end
