"""Per-run structure derived from the events: allocations, attempts, step and checkpoint intervals.

Everything here is job-level wall time: a step of an attempt spans from the first rank's start to the last
rank's end; a checkpoint from the first rank's `checkpoint_start` to the last rank's `checkpoint_end`. Every time
is on the run's reference clock: a host whose clock is off has its times taken back first
(services.analysis.clocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from services.analysis.clocks import on_one_clock
from services.analysis.phases import eval_spans, init_waits
from services.analysis.run_data import RunData, ranks_own
from services.schemas.categories import RunStatus
from services.schemas.clocks import HostClock


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    start: float
    end: float
    gpus: int
    open: bool  # no allocation_end yet: ends at the run's latest event


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    attempt: int
    start: float
    end: float  # effective end: reported; else, followed by another attempt, its latest event of any kind (at
    # most the next attempt's start); else the run's end / latest event
    end_reported: bool
    reason: str | None  # completed | failed | preempted | None (not reported)
    failed: bool
    world_size: int
    hosts: tuple[str, ...]
    resume_step: int | None  # reported or inferred (first step - 1); None: no steps and no resume
    resume_reported: bool
    first_step_start: float | None
    last_step_end: float | None
    first_step: int | None
    last_step: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStructure:
    run_id: str
    status: RunStatus
    submitted: float | None
    first_time: float | None
    latest_time: float | None
    run_end_time: float | None
    allocations: tuple[Allocation, ...]
    allocations_reported: bool
    attempts: tuple[Attempt, ...]
    steps: pd.DataFrame  # the run's steps, one row per (attempt, rank, step)
    job_steps: pd.DataFrame  # attempt, step, start, end, ranks (one row per attempt and step)
    checkpoints: pd.DataFrame  # attempt, step, start, end, ok, torn
    evals: pd.DataFrame  # attempt, step, start, end (services.analysis.phases)
    init_waits: dict[int, float]  # attempt -> when its ranks began waiting in an init_process_group that failed
    clocks: tuple[HostClock, ...] = ()  # each measured host's clock offset (services.analysis.clocks)
    events: pd.DataFrame | None = None  # the control events on the reference clock (RunData.events' columns)

    def saved_state(self) -> tuple[int, float]:
        """The newest saved state of the run's surviving lineage, what a relaunch would resume from (docs/ledger.md,
        "Rework"): (the position of the last attempt that resumed or stepped, the later of its resume step and the
        last checkpoint completed ok by it or by an attempt after it). A checkpoint of an earlier attempt survives
        only up to that resume step (a resume from below it threw it away). Attempts after it that never got to
        resume (they died in rendezvous or before `init()`) change nothing; with none that resumed, every
        checkpoint completed ok counts, from position 0."""
        resumed = [i for i, a in enumerate(self.attempts) if a.resume_step is not None]
        position = resumed[-1] if resumed else 0
        saved = float(self.attempts[position].resume_step or 0) if self.attempts else 0.0
        ck = self.checkpoints
        if not ck.empty:
            later = {a.attempt for a in self.attempts[position:]}
            ok = ck[ck["attempt"].isin(later) & ck["ok"].astype(bool)]
            if not ok.empty:
                saved = max(saved, float(ok["step"].max()))
        return position, saved


def latest_time(data: RunData) -> float | None:
    return _extreme(data, max, ("time", "end", "end"))


def first_time(data: RunData) -> float | None:
    return _extreme(data, min, ("time", "start", "start"))


def _extreme(data: RunData, pick: Any, columns: tuple[str, str, str]) -> float | None:
    """The earliest / latest time in any of the run's frames (events, steps, collectives)."""
    values = [
        getattr(frame[column], pick.__name__)()
        for frame, column in zip((data.events, data.steps, data.collectives), columns, strict=True) if not frame.empty
    ]
    summary = data.step_summary
    if summary is not None and not summary.empty:
        values.append(summary.raw_last_end if pick is max else summary.raw_first_start)
    finite = [float(v) for v in values if pd.notna(v)]
    return float(pick(finite)) if finite else None


def dedupe_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (attempt, rank, step), whatever order or how often it arrived (replays regroup steps):
    sorted by (attempt, rank, step); of copies of one step, the one with the earliest (start, end) counts."""
    if steps.empty:
        return steps
    key = step_key(steps)
    if key is not None:  # the usual case, done in numpy: storage hands the rows over sorted and unique
        if len(key) < 2 or bool((key[1:] > key[:-1]).all()):
            return steps.reset_index(drop=True)
        order = np.argsort(key, kind="stable")
        ordered_key = key[order]
        if not (ordered_key[1:] == ordered_key[:-1]).any():
            return steps.take(order).reset_index(drop=True)
    ordered = steps.sort_values(["attempt", "rank", "step", "start", "end"], kind="stable")
    return ordered.drop_duplicates(["attempt", "rank", "step"], keep="first").reset_index(drop=True)


def step_key(steps: pd.DataFrame) -> np.ndarray | None:
    """(attempt, rank, step) packed in one int64 that sorts like the triple, or None when a value does not fit
    (attempt < 2**15, rank < 2**21, step < 2**27: every real run; the caller then takes the slow path)."""
    attempt = steps["attempt"].to_numpy(np.int64)
    rank = steps["rank"].to_numpy(np.int64)
    step = steps["step"].to_numpy(np.int64)
    for values, bits in ((attempt, 15), (rank, 21), (step, 27)):
        if values.min() < 0 or values.max() >= 1 << bits:
            return None
    packed: np.ndarray = (attempt << 48) | (rank << 27) | step
    return packed


def build_job_steps(steps: pd.DataFrame) -> pd.DataFrame:
    if steps.empty:
        return pd.DataFrame({"attempt": pd.Series([], dtype=np.int64), "step": pd.Series([], dtype=np.int64),
                             "start": pd.Series([], dtype=float), "end": pd.Series([], dtype=float),
                             "ranks": pd.Series([], dtype=np.int64)})
    # pandas' groupby(["attempt", "step"]).agg(start min, end max, ranks size), from one sort
    attempt, step = steps["attempt"].to_numpy(np.int64), steps["step"].to_numpy(np.int64)
    order = np.lexsort((step, attempt))
    attempt, step = attempt[order], step[order]
    first = np.flatnonzero(np.r_[True, (attempt[1:] != attempt[:-1]) | (step[1:] != step[:-1])])
    return pd.DataFrame({
        "attempt": attempt[first], "step": step[first],
        "start": np.fmin.reduceat(steps["start"].to_numpy(np.float64)[order], first),  # fmin: NaN skipped
        "end": np.fmax.reduceat(steps["end"].to_numpy(np.float64)[order], first),
        "ranks": np.diff(np.r_[first, len(order)]).astype(np.int64)})


def build_run_structure(data: RunData) -> RunStructure:
    data, clocks = on_one_clock(data)
    events = data.events
    steps = dedupe_steps(data.steps)
    summary = data.step_summary
    if summary is not None:  # the steps reduced per block: the same job steps and per-attempt figures
        job_steps = summary.job_steps
        step_stats = _step_stats_of_job_steps(job_steps, summary.attempt_ranks)
    else:
        job_steps = build_job_steps(steps)
        step_stats = _step_stats(steps)
    latest = latest_time(data)

    status, run_end_time = _run_status(events)
    submitted_times = events.loc[events["kind"] == "run_submitted", "time"]
    submitted = float(submitted_times.min()) if not submitted_times.empty else None

    attempts = _build_attempts(events, step_stats, status, run_end_time, latest)
    checkpoints = _build_checkpoints(events, job_steps, attempts, latest)
    allocations, reported = _build_allocations(events, attempts, latest)
    return RunStructure(
        run_id=data.run_id,
        status=status,
        submitted=submitted,
        first_time=first_time(data),
        latest_time=latest,
        run_end_time=run_end_time,
        allocations=allocations,
        allocations_reported=reported,
        attempts=attempts,
        steps=steps,
        job_steps=job_steps,
        checkpoints=checkpoints,
        evals=eval_spans(events, job_steps),
        init_waits=init_waits(events),
        clocks=clocks,
        events=events,
    )


def _run_status(events: pd.DataFrame) -> tuple[RunStatus, float | None]:
    ends = events[events["kind"] == "run_end"].sort_values(["time", "status"])
    if ends.empty:
        return RunStatus.RUNNING, None
    last = ends.iloc[-1]
    return RunStatus(str(last["status"])), float(last["time"])


def _build_attempts(
    events: pd.DataFrame, step_stats: dict[int, _StepStats], status: RunStatus, run_end_time: float | None,
    latest: float | None
) -> tuple[Attempt, ...]:
    events = ranks_own(events)
    with_attempt = events[events["attempt"].notna()]
    numbers = set(with_attempt["attempt"].astype(np.int64).tolist()) | set(step_stats)
    ordered = sorted(int(n) for n in numbers)
    if not ordered:
        return ()

    starts: dict[int, float] = {}
    raw: list[_RawAttempt] = []
    for number in ordered:
        ev = with_attempt[with_attempt["attempt"] == number]
        started = ev[ev["kind"] == "attempt_start"]
        ended = ev[ev["kind"] == "attempt_end"]
        resumes = ev[ev["kind"] == "resume"]
        st = step_stats.get(number)
        if not started.empty:
            start = float(started["time"].min())
        else:  # attempt_start lost: its earliest sign of life
            candidates = [float(ev["time"].min())] if not ev.empty else []
            if st is not None:
                candidates.append(st.first_start)
            start = min(candidates)
        starts[number] = start
        world: float = float(started["world_size"].max()) if not started.empty else np.nan
        if math.isnan(world):
            world = st.ranks if st is not None else (ev["rank"].nunique() or 1)
        reasons = set(ended["reason"].dropna().astype(str))
        reason = "failed" if "failed" in reasons else "preempted" if "preempted" in reasons else (
            "completed" if reasons else None)
        if not resumes.empty:
            resume: int | None = int(resumes["step"].min())
            resume_reported = True
        elif st is not None:
            resume, resume_reported = st.first_step - 1, False
        else:
            resume, resume_reported = None, False
        raw.append({
            "attempt": number, "start": start,
            "end_time": float(ended["time"].max()) if not ended.empty else None,
            "last_seen": _last_seen(ev, st.last_end if st is not None else None),
            "reason": reason, "world_size": int(world),
            "hosts": tuple(sorted(set(started["host"].dropna().astype(str)))),
            "resume": resume, "resume_reported": resume_reported,
            "first_start": st.first_start if st is not None else None,
            "last_end": st.last_end if st is not None else None,
            "first_step": st.first_step if st is not None else None,
            "last_step": st.last_step if st is not None else None,
        })

    attempts: list[Attempt] = []
    for i, a in enumerate(raw):
        is_last = i == len(raw) - 1
        next_start = raw[i + 1]["start"] if not is_last else None
        end_time = a["end_time"]
        if end_time is not None:
            # A reported end before the attempt's own start or last step (a skewed clock, events of two
            # batches that contradict each other) is read as the end of its last sign of life: an attempt never
            # ends before it starts, and its steps are never dropped (docs/ledger.md, "Contradicting inputs").
            own = [float(end_time), float(a["start"])]
            if a["last_end"] is not None:
                own.append(float(a["last_end"]))
            end, reported = max(own), True
        elif next_start is not None:
            # Killed without a word (SIGKILL, OOM killer, a lost node): it was alive until its latest event,
            # heart-beating while stuck or not; what follows until the next attempt's first step is detection,
            # teardown and relaunch, the restart's startup (docs/ledger.md, "Attempts"). Never past the next
            # attempt's start (a late clock), never before its own start.
            seen = min(float(a["last_seen"]), float(next_start))
            end, reported = max(seen, float(a["start"])), False
        elif run_end_time is not None:
            end, reported = max(run_end_time, float(a["start"])), False
        else:
            end, reported = float(latest if latest is not None else a["start"]), False
        failed = (
            a["reason"] == "failed"
            or (end_time is None and not is_last)
            or (is_last and status is RunStatus.FAILED)
        )
        attempts.append(Attempt(
            attempt=int(a["attempt"]),
            start=float(a["start"]),
            end=end,
            end_reported=reported,
            reason=a["reason"],
            failed=bool(failed),
            world_size=int(a["world_size"]),
            hosts=a["hosts"],
            resume_step=a["resume"],
            resume_reported=bool(a["resume_reported"]),
            first_step_start=a["first_start"],
            last_step_end=a["last_end"],
            first_step=a["first_step"],
            last_step=a["last_step"],
        ))
    return tuple(attempts)


@dataclass(frozen=True, slots=True, kw_only=True)
class _StepStats:
    """One attempt's steps in brief."""

    first_start: float
    last_end: float
    first_step: int
    last_step: int
    ranks: int  # ranks that reported a step


def _step_stats(steps: pd.DataFrame) -> dict[int, _StepStats]:
    """Per attempt that reported steps: its first step start, last step end, first and last step, ranks.
    `steps`: sorted by (attempt, rank, step) (`dedupe_steps`), so each attempt's rows, and each rank's, are together."""
    if steps.empty:
        return {}
    attempt, rank = steps["attempt"].to_numpy(np.int64), steps["rank"].to_numpy(np.int64)
    step = steps["step"].to_numpy(np.int64)
    new_attempt = np.r_[True, attempt[1:] != attempt[:-1]]
    first = np.flatnonzero(new_attempt)
    rows = zip(attempt[first].tolist(), np.fmin.reduceat(steps["start"].to_numpy(np.float64), first).tolist(),
               np.fmax.reduceat(steps["end"].to_numpy(np.float64), first).tolist(),  # fmin / fmax: NaN skipped
               np.minimum.reduceat(step, first).tolist(), np.maximum.reduceat(step, first).tolist(),
               np.add.reduceat(new_attempt | np.r_[True, rank[1:] != rank[:-1]], first, dtype=np.int64).tolist(),
               strict=True)
    return {int(a): _StepStats(first_start=float(fs), last_end=float(le), first_step=int(f), last_step=int(la),
                               ranks=int(n))
            for a, fs, le, f, la, n in rows}


def _step_stats_of_job_steps(job_steps: pd.DataFrame, attempt_ranks: dict[int, int]) -> dict[int, _StepStats]:
    """`_step_stats` from the job steps (first start, last end, first and last step are theirs) and the ranks that
    reported a step in each attempt."""
    if job_steps.empty:
        return {}
    stats = job_steps.groupby("attempt").agg(first_start=("start", "min"), last_end=("end", "max"),
                                             first_step=("step", "min"), last_step=("step", "max"))
    rows = zip(stats.index.to_numpy(np.int64), stats["first_start"].to_numpy(np.float64),
               stats["last_end"].to_numpy(np.float64), stats["first_step"].to_numpy(np.int64),
               stats["last_step"].to_numpy(np.int64), strict=True)
    return {int(a): _StepStats(first_start=float(fs), last_end=float(le), first_step=int(f), last_step=int(la),
                               ranks=attempt_ranks[int(a)])
            for a, fs, le, f, la in rows}


class _RawAttempt(TypedDict):
    """An attempt as read from its events and steps, before its effective end is worked out."""

    attempt: int
    start: float
    end_time: float | None
    last_seen: float
    reason: str | None
    world_size: int
    hosts: tuple[str, ...]
    resume: int | None
    resume_reported: bool
    first_start: float | None
    last_end: float | None
    first_step: int | None
    last_step: int | None


def _last_seen(events: pd.DataFrame, last_step_end: float | None) -> float:
    """The time of an attempt's latest event of any kind (step end, heartbeat, checkpoint, digest, client_stats
    ...). Collective rows are left out: the stored ledger reads collective time summed per step, not the rows,
    and a rank inside a collective still heart-beats (with the collectives it started)."""
    times = [float(events["time"].max())] if not events.empty else []
    if last_step_end is not None:
        times.append(last_step_end)
    finite = [t for t in times if not np.isnan(t)]
    return max(finite) if finite else -np.inf


def _build_checkpoints(
    events: pd.DataFrame, job_steps: pd.DataFrame, attempts: tuple[Attempt, ...], latest: float | None
) -> pd.DataFrame:
    columns = ["attempt", "step", "start", "end", "ok", "torn"]
    ck = events[events["kind"].isin(["checkpoint_start", "checkpoint_end"])]
    if ck.empty:
        return pd.DataFrame({c: pd.Series([], dtype=float if c in ("start", "end") else object) for c in columns})
    ck = ck.assign(
        attempt=ck["attempt"].astype(np.int64), step=ck["step"].astype(np.int64),
        t_start=ck["time"].where(ck["kind"] == "checkpoint_start"),
        t_end=ck["time"].where(ck["kind"] == "checkpoint_end"),
        is_end=ck["kind"] == "checkpoint_end",
        not_ok=(ck["kind"] == "checkpoint_end") & ~ck["ok"].map(lambda v: v is True),
    )
    out = ck.groupby(["attempt", "step"], sort=True).agg(
        start=("t_start", "min"), end=("t_end", "max"), ends=("is_end", "sum"), bad=("not_ok", "sum"),
        first_end=("t_end", "min"),
    ).reset_index()
    out["start"] = out["start"].fillna(out["first_end"])  # start lost: from the first end
    out["end"] = np.maximum(out["end"], out["start"])  # an end before its start: a write of no length
    out["torn"] = out["ends"] == 0
    out["ok"] = (~out["torn"]) & (out["bad"] == 0)
    attempt_end = {a.attempt: a.end for a in attempts}
    ck_attempts, ck_starts = out["attempt"].to_numpy(np.int64), out["start"].to_numpy(np.float64)
    for i in np.flatnonzero(out["torn"].to_numpy()):
        # Torn write: blocked until the loop next made progress, or until the attempt ended.
        attempt, start = int(ck_attempts[i]), float(ck_starts[i])
        later = job_steps[(job_steps["attempt"] == attempt) & (job_steps["start"] >= start)]
        candidates = [attempt_end.get(attempt, latest if latest is not None else start)]
        if not later.empty:
            candidates.append(float(later["start"].min()))
        out.at[i, "end"] = max(start, min(candidates))
    out["ok"] = out["ok"].astype(bool)
    out["torn"] = out["torn"].astype(bool)
    return out[columns]


def _build_allocations(
    events: pd.DataFrame, attempts: tuple[Attempt, ...], latest: float | None
) -> tuple[tuple[Allocation, ...], bool]:
    alloc = events[events["kind"].isin(["allocation_start", "allocation_end"])]
    # Ends before starts at one instant (a requeue); of two starts at one instant the one with more GPUs comes
    # last and counts (the other ends where it starts, with no length), whatever order they arrived in.
    alloc = alloc.sort_values(["time", "kind", "gpus"], ascending=[True, True, True], kind="stable")
    out: list[Allocation] = []
    if not alloc.empty:
        open_start: float | None = None
        open_gpus = 0
        rows = zip(alloc["kind"].to_numpy(), alloc["time"].to_numpy(np.float64), alloc["gpus"].to_numpy(np.float64),
                   strict=True)  # gpus: NaN on allocation_end rows
        for kind, time, gpus in rows:
            if kind == "allocation_start":
                if open_start is not None:  # a start while open: the previous allocation ended here
                    out.append(Allocation(start=open_start, end=float(time), gpus=open_gpus, open=False))
                open_start, open_gpus = float(time), int(gpus)
            elif open_start is not None:
                out.append(Allocation(start=open_start, end=float(time), gpus=open_gpus, open=False))
                open_start = None
        if open_start is not None:
            end = max(open_start, latest if latest is not None else open_start)
            out.append(Allocation(start=open_start, end=end, gpus=open_gpus, open=True))
        if out:
            return tuple(out), True
    # No allocation events: the attempts' spans x world size (overlapping spans merged). A killed attempt (no
    # reported end, another after it) held its GPUs until the next one started: its span reaches that start.
    held_until = [
        max(a.end, nxt.start) if not a.end_reported and nxt is not None else a.end
        for a, nxt in zip(attempts, (*attempts[1:], None), strict=False)  # no attempt: the None is left over
    ]
    spans = sorted((a.start, end, a.world_size) for a, end in zip(attempts, held_until, strict=True))
    merged: list[list[float]] = []
    for start, end, world in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
            merged[-1][2] = max(merged[-1][2], world)
        else:
            merged.append([start, end, world])
    return tuple(Allocation(start=s, end=e, gpus=int(g), open=False) for s, e, g in merged), False
