"""Read models for the dashboard: one run's timeline, step progress, per-rank compute, checkpoints, restarts.

Pure functions: a RunData and the run's ledger (``WasteLedger.to_dict()``) in, JSON-able dicts out. Every
GPU-second figure shown next to these views comes from the ledger; the views only say *when* and *where*.
Sizes are bounded so a run of any size sends the browser a few thousand points:

- step progress: at most ``max_points`` points over all attempts (``2,000`` per attempt at most);
- the "where the time went" band: painted exactly as the ledger paints it, adjacent pieces of one category
  merged, then binned to at most ``max_segments`` pieces when still longer;
- per-rank compute: one row per rank (median / p90 / mean of step duration minus collective time) and a heat
  map of at most ``heat_rows`` rank groups x ``heat_cols`` step buckets (the slowest rank of a group wins,
  so a straggler stays visible);
- every other list holds at most ``MAX_TIMELINE_ROWS`` items (allocations, attempts, hangs, failures, restarts:
  the latest ones) or ``MAX_RANK_ROWS`` rank rows (flagged stragglers, then the costliest and slowest ranks);
  ``<list>_total`` says how many there were and ``<list>_truncated`` whether some were left out.

Whether a running run still makes progress is services.analysis.live's job (GET /v1/runs/{id}/live).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from services.analysis.attempts import RunStructure, build_run_structure
from services.analysis.ledger import (  # the ledger's own painting rules
    _CLAIM_CATEGORY,
    build_claims,
    kept_mask,
)
from services.analysis.painting import paint
from services.analysis.run_data import RunData
from services.analysis.stragglers import flagged_ranks

MAX_POINTS_PER_ATTEMPT = 2000
MAX_POINTS = 20_000
MAX_SEGMENTS = 3000
HEAT_ROWS = 128
HEAT_COLS = 60
MAX_CHECKPOINT_ROWS = 5000
MAX_TIMELINE_ROWS = 500
MAX_RANK_ROWS = 512

_IDLE = "idle"


def build_run_views(
    data: RunData,
    ledger: Mapping[str, Any],
    *,
    max_points: int = MAX_POINTS,
    max_segments: int = MAX_SEGMENTS,
    heat_rows: int = HEAT_ROWS,
    heat_cols: int = HEAT_COLS,
    run: RunStructure | None = None,
) -> dict[str, Any]:
    """Everything the run page draws besides the ledger's numbers, as one JSON-able dict.

    `run`: the data's structure when the caller already built it for the ledger."""
    run = build_run_structure(data) if run is None else run
    attempts = run.attempts
    position = {a.attempt: i for i, a in enumerate(attempts)}
    job_steps = run.job_steps.copy()
    job_steps["pos"] = job_steps["attempt"].map(position).astype(np.int64) if not job_steps.empty else []
    job_steps["kept"] = kept_mask(run, job_steps)

    checkpoints = _checkpoint_rows(run.checkpoints)
    hangs = [
        {"attempt": a.attempt, "start": a.last_step_end, "end": a.end, "seconds": a.end - a.last_step_end}
        for a in attempts if a.failed and a.last_step_end is not None and a.end > a.last_step_end
    ]
    segments = _segments(run, job_steps, position, max_segments)
    timeline: dict[str, Any] = {}
    _capped(timeline, "allocations", [{"start": a.start, "end": a.end, "gpus": a.gpus, "open": a.open}
                                      for a in run.allocations[-MAX_TIMELINE_ROWS:]], len(run.allocations))
    _capped(timeline, "attempts", [
        {"attempt": a.attempt, "start": a.start, "end": a.end, "reason": a.reason, "failed": a.failed,
         "world_size": a.world_size, "resume_step": a.resume_step, "first_step": a.first_step,
         "last_step": a.last_step, "first_step_start": a.first_step_start, "last_step_end": a.last_step_end}
        for a in attempts[-MAX_TIMELINE_ROWS:]], len(attempts))
    timeline["segments"] = segments
    timeline["idle_gaps"] = [s for s in segments if s["category"] == _IDLE]
    _capped(timeline, "hangs", hangs[-MAX_TIMELINE_ROWS:], len(hangs))
    failures = [a for a in attempts if a.failed]
    _capped(timeline, "failures", [{"attempt": a.attempt, "time": a.end, "step": a.last_step,
                                    "reason": a.reason or "lost"} for a in failures[-MAX_TIMELINE_ROWS:]],
            len(failures))
    _capped(timeline, "restarts", [{"attempt": a.attempt, "time": a.start, "resume_step": a.resume_step}
                                   for a in attempts[1:][-MAX_TIMELINE_ROWS:]], max(len(attempts) - 1, 0))
    timeline["progress"] = _progress(run, job_steps, max_points)
    out = {
        "run_id": run.run_id,
        "status": run.status.value,
        "first_time": run.first_time,
        "latest_time": run.latest_time,
        "timeline": timeline,
        "progress": _progress_stats(job_steps, run.checkpoints),
        "ranks": _rank_compute(data, run.steps, ledger, heat_rows, heat_cols),
    }
    _capped(out, "checkpoints", checkpoints[-MAX_CHECKPOINT_ROWS:], len(checkpoints))
    restarts = build_restart_rows(ledger)
    _capped(out, "restarts", restarts[-MAX_TIMELINE_ROWS:], len(restarts))
    return out


def _capped(out: dict[str, Any], name: str, items: list[Any], total: int) -> None:
    """out[name] = items (already cut to its cap), with `<name>_total` and `<name>_truncated` beside it."""
    out[name] = items
    out[f"{name}_total"] = total
    out[f"{name}_truncated"] = total > len(items)


def build_restart_rows(ledger: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per restart, from the ledger's attempts: what the failure before it cost, in GPU-seconds.

    rework and hang are booked on the attempt that failed, startup on the attempt that restarted.
    """
    attempts = list(ledger.get("attempts", []))
    rows = []
    for prev, cur in itertools.pairwise(attempts):
        prev_s, cur_s = prev["gpu_seconds"], cur["gpu_seconds"]
        rows.append({
            "attempt": cur["attempt"],
            "time": cur["start"],
            "after": prev["reason"] or ("failed" if prev["failed"] else "ended"),
            "failed_at_step": prev["last_step"],
            "resume_step": cur["resume_step"],
            "steps_reworked": prev["steps_reworked"],
            "rework_gpu_seconds": float(prev_s.get("rework", 0.0)),
            "hang_gpu_seconds": float(prev_s.get("hang", 0.0)),
            "startup_gpu_seconds": float(cur_s.get("startup", 0.0)),
        })
    return rows


# -- timeline --------------------------------------------------------------------------------------------


def _segments(run: Any, job_steps: pd.DataFrame, position: dict[int, int], max_segments: int) -> list[dict[str, Any]]:
    """The allocated wall time painted with the ledger's claims: [{start, end, category}], one category each."""
    if not run.allocations:
        return []
    claims = build_claims(run, job_steps, position)
    painted = paint(
        np.array([a.start for a in run.allocations], dtype=np.float64),
        np.array([a.end for a in run.allocations], dtype=np.float64),
        np.array([a.gpus for a in run.allocations], dtype=np.int64),
        claims[0], claims[1], claims[2],
    )
    if len(painted.bounds) < 2:
        return []
    n_pos = max(len(run.attempts), 1)
    names = np.array([_CLAIM_CATEGORY[p] for p in sorted(_CLAIM_CATEGORY)] + [_IDLE], dtype=object)
    prio = np.where(painted.key >= 0, painted.key // n_pos, len(names) - 1)
    inside = painted.base > 0
    starts, ends = painted.bounds[:-1][inside], painted.bounds[1:][inside]
    codes = prio[inside]
    if len(starts) == 0:
        return []
    starts, ends, codes = _merge_runs(starts, ends, codes)
    if len(starts) > max_segments:
        starts, ends, codes = _bin_segments(starts, ends, codes, max_segments, len(names))
    return [{"start": float(s), "end": float(e), "category": str(names[c])}
            for s, e, c in zip(starts, ends, codes)]


def _merge_runs(starts: np.ndarray, ends: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Merge touching neighbours of the same category."""
    new = np.ones(len(starts), dtype=bool)
    new[1:] = (codes[1:] != codes[:-1]) | (starts[1:] > ends[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(starts) - 1)
    return starts[first], ends[last], codes[first]


def _bin_segments(starts: np.ndarray, ends: np.ndarray, codes: np.ndarray, n_bins: int,
                  n_codes: int) -> tuple[np.ndarray, ...]:
    """Too many pieces to draw: split the span into n_bins equal bins, each shown as its dominant category."""
    edges = np.linspace(starts[0], ends[-1], n_bins + 1)
    weight = np.zeros((n_bins, n_codes))
    # seconds of each piece inside each bin: pieces are sorted and disjoint, most fall inside one bin
    lo = np.clip(np.searchsorted(edges, starts, side="right") - 1, 0, n_bins - 1)
    hi = np.clip(np.searchsorted(edges, ends, side="left") - 1, 0, n_bins - 1)
    single = lo == hi
    np.add.at(weight, (lo[single], codes[single]), (ends - starts)[single])
    for i in np.flatnonzero(~single):
        for b in range(lo[i], hi[i] + 1):
            overlap = min(ends[i], edges[b + 1]) - max(starts[i], edges[b])
            if overlap > 0:
                weight[b, codes[i]] += overlap
    has = weight.sum(axis=1) > 0
    bin_codes = weight.argmax(axis=1)
    return _merge_runs(edges[:-1][has], edges[1:][has], bin_codes[has])


def _progress(run: Any, job_steps: pd.DataFrame, max_points: int) -> list[dict[str, Any]]:
    """Step number over time per attempt (a step's end), downsampled; `rework_after_step` marks thrown-away work."""
    if job_steps.empty:
        return []
    shown = run.attempts[-MAX_TIMELINE_ROWS:]  # the attempts the timeline lists
    per_attempt = min(MAX_POINTS_PER_ATTEMPT, max(2, max_points // max(len(shown), 1)))
    out = []
    for a in shown:
        mine = job_steps[job_steps["attempt"] == a.attempt]
        if mine.empty:
            continue
        mine = mine.sort_values("step")
        n = len(mine)
        idx = np.unique(np.linspace(0, n - 1, per_attempt).round().astype(np.int64)) if n > per_attempt else None
        pick = mine.iloc[idx] if idx is not None else mine
        kept = mine["kept"].to_numpy()
        all_steps = mine["step"].to_numpy()
        if kept.all():
            rework_after: int | None = None  # every step of the attempt counts
        elif kept.any():
            rework_after = int(all_steps[kept].max())
        else:
            rework_after = int(all_steps.min()) - 1
        out.append({
            "attempt": a.attempt,
            "time": pick["end"].astype(float).tolist(),
            "step": pick["step"].astype(int).tolist(),
            "steps_total": int(n),
            "rework_after_step": rework_after,
        })
    return out


def _progress_stats(job_steps: pd.DataFrame, checkpoints: pd.DataFrame) -> dict[str, Any]:
    """The usual step time (median gap between consecutive step ends, last 1,000 steps) and the last progress."""
    if job_steps.empty:
        return {"median_step_seconds": None, "last_progress_time": None, "last_step": None}
    last_attempt = int(job_steps["attempt"].max())
    mine = job_steps[job_steps["attempt"] == last_attempt].sort_values("step").tail(1001)
    gaps = np.diff(mine["end"].to_numpy())
    gaps = gaps[gaps > 0]
    if gaps.size:
        usual = float(np.median(gaps))
    else:
        usual = float(np.median((job_steps["end"] - job_steps["start"]).to_numpy()))
    last_time = float(job_steps["end"].max())
    if not checkpoints.empty:
        done = checkpoints[checkpoints["ok"].astype(bool)]
        if not done.empty:
            last_time = max(last_time, float(done["end"].max()))
    last_row = job_steps.loc[job_steps["end"].idxmax()]
    return {"median_step_seconds": usual, "last_progress_time": last_time, "last_step": int(last_row["step"])}


def _checkpoint_rows(checkpoints: pd.DataFrame) -> list[dict[str, Any]]:
    if checkpoints.empty:
        return []
    ck = checkpoints.sort_values("start")
    return [
        {"attempt": int(r.attempt), "step": int(r.step), "start": float(r.start), "end": float(r.end),
         "blocking_seconds": float(r.end - r.start), "ok": bool(r.ok), "torn": bool(r.torn)}
        for r in ck.itertuples(index=False)
    ]


# -- per-rank compute ------------------------------------------------------------------------------------


def _rank_compute(data: RunData, steps: pd.DataFrame, ledger: Mapping[str, Any], heat_rows: int,
                  heat_cols: int) -> dict[str, Any]:
    """Per rank: compute seconds per step (duration minus time in collectives), median / p90 / mean.

    `steps`: the run's steps, one row per (attempt, rank, step) (RunStructure.steps)."""
    by_rank_cost = {int(k): float(v) for k, v in ledger.get("straggler_gpu_seconds_by_rank", {}).items()}
    empty = {"rows": [], "heatmap": None, "compute_source": None, "straggler_ranks": []}
    if steps.empty:
        return empty
    attempt = steps["attempt"].to_numpy(np.int64)
    rank = steps["rank"].to_numpy(np.int64)
    step = steps["step"].to_numpy(np.int64)
    duration = (steps["end"] - steps["start"]).to_numpy(np.float64)
    comm = steps["comm"].to_numpy(np.float64)
    source = "step duration"
    summed = getattr(data, "comm", None)  # collective seconds per (attempt, rank, step), summed by storage
    coll = data.collectives
    if summed is not None and not summed.empty:
        ckey = _key(summed["attempt"].to_numpy(np.int64), summed["rank"].to_numpy(np.int64),
                    summed["step"].to_numpy(np.int64))
        order = np.argsort(ckey, kind="stable")
        ukeys, csum = ckey[order], summed["seconds"].to_numpy(np.float64)[order]
    elif not coll.empty:
        coll = coll[~coll.duplicated(["attempt", "rank", "step", "op", "start"])]
        ckey = _key(coll["attempt"].to_numpy(np.int64), coll["rank"].to_numpy(np.int64),
                    coll["step"].to_numpy(np.int64))
        cdur = (coll["end"] - coll["start"]).to_numpy(np.float64)
        ukeys, inverse = np.unique(ckey, return_inverse=True)
        csum = np.bincount(inverse, weights=cdur, minlength=len(ukeys))
    else:
        ukeys = None
    if ukeys is not None and len(ukeys):
        where = np.searchsorted(ukeys, _key(attempt, rank, step))
        where = np.clip(where, 0, len(ukeys) - 1)
        found = ukeys[where] == _key(attempt, rank, step)
        comm = np.where(np.isnan(comm) & found, csum[where], comm)  # a step's own comm wins, as in the ledger
    if np.isfinite(comm).any():
        source = "step duration minus collectives"
    compute = np.clip(duration - np.nan_to_num(comm, nan=0.0), 0.0, None)

    frame = pd.DataFrame({"rank": rank, "step": step, "compute": compute})
    grouped = frame.groupby("rank", sort=True)["compute"]
    stats = pd.DataFrame({
        "steps": grouped.size(),
        "median_s": grouped.median(),
        "p90_s": grouped.quantile(0.9),
        "mean_s": grouped.mean(),
    })
    hosts = _hosts(data.events)
    overall = float(stats["median_s"].median())
    total_cost = sum(by_rank_cost.values())
    known = np.isfinite(comm)  # the flag rule of /stragglers, over the steps with collective timings
    evidence = flagged_ranks(
        pd.DataFrame({"attempt": attempt[known], "rank": rank[known], "step": step[known],
                      "compute": compute[known]}),
        {r: v / total_cost for r, v in by_rank_cost.items()} if total_cost > 0 else {})
    stragglers = {r for r, e in evidence.items() if e["flagged"]}
    listed = stats
    if len(stats) > MAX_RANK_ROWS:  # flagged stragglers, then the costliest, then the slowest ranks
        order = sorted(stats.index, key=lambda r: (int(r) not in stragglers, -by_rank_cost.get(int(r), 0.0),
                                                   -float(stats.at[r, "median_s"]), int(r)))
        listed = stats.loc[sorted(order[:MAX_RANK_ROWS])]
    rows = [
        {"rank": int(r), "host": hosts.get(int(r)), "steps": int(n), "median_compute_s": float(med),
         "p90_compute_s": float(p90), "mean_compute_s": float(mean),
         "straggler_gpu_seconds": by_rank_cost.get(int(r), 0.0), "is_straggler": int(r) in stragglers}
        for r, n, med, p90, mean in zip(listed.index, listed["steps"], listed["median_s"], listed["p90_s"],
                                        listed["mean_s"])
    ]
    return {
        "rows": rows,
        "rows_total": len(stats),
        "rows_truncated": len(stats) > len(listed),
        "median_compute_s": overall,
        "heatmap": _heatmap(frame, heat_rows, heat_cols),
        "compute_source": source,
        "straggler_ranks": sorted(stragglers),
    }


def _key(attempt: np.ndarray, rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    # attempt < 2**15, rank < 2**21 (world_size <= 2**20), step < 2**27 covers every real run; larger steps
    # still sort uniquely as long as attempt and rank stay small
    return (attempt << 48) | (rank << 27) | step


def _heatmap(frame: pd.DataFrame, heat_rows: int, heat_cols: int) -> dict[str, Any]:
    """Mean compute seconds per (rank group, step bucket); a group shows its slowest rank."""
    ranks = np.sort(frame["rank"].unique())
    lo_step, hi_step = int(frame["step"].min()), int(frame["step"].max())
    n_cols = max(1, min(heat_cols, hi_step - lo_step + 1))
    col_edges = np.linspace(lo_step, hi_step + 1, n_cols + 1)
    col = np.clip(np.searchsorted(col_edges, frame["step"].to_numpy(), side="right") - 1, 0, n_cols - 1)
    rank_pos = np.searchsorted(ranks, frame["rank"].to_numpy())
    cell = rank_pos * n_cols + col
    total = np.bincount(cell, weights=frame["compute"].to_numpy(), minlength=len(ranks) * n_cols)
    count = np.bincount(cell, minlength=len(ranks) * n_cols)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (total / count).reshape(len(ranks), n_cols)
    group = max(1, int(np.ceil(len(ranks) / heat_rows)))
    n_groups = int(np.ceil(len(ranks) / group))
    padded = np.full((n_groups * group, n_cols), np.nan)
    padded[: len(ranks)] = mean
    grid = np.fmax.reduce(padded.reshape(n_groups, group, n_cols), axis=1) if group > 1 else padded  # NaN: no data
    labels = [
        str(int(ranks[i * group])) if group == 1
        else f"{int(ranks[i * group])}-{int(ranks[min((i + 1) * group, len(ranks)) - 1])}"
        for i in range(n_groups)
    ]
    step_labels = [round(float(col_edges[i] + col_edges[i + 1] - 1) / 2) for i in range(n_cols)]
    return {
        "rank_labels": labels,
        "ranks_per_row": group,
        "step_centers": step_labels,
        "step_edges": [float(x) for x in col_edges],
        "z": [[None if not np.isfinite(v) else round(float(v), 6) for v in row] for row in grid],
    }


def _hosts(events: pd.DataFrame) -> dict[int, str]:
    started = events[(events["kind"] == "attempt_start") & events["rank"].notna() & events["host"].notna()]
    if started.empty:
        return {}
    last = started.sort_values("time").drop_duplicates("rank", keep="last")
    return {int(r): str(h) for r, h in zip(last["rank"], last["host"])}
