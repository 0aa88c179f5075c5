"""Read models for the dashboard: one run's timeline, step progress, per-rank compute, checkpoints, restarts.

Pure functions: a RunData and the run's typed ledger in, the typed `RunViews` out (services.schemas.views). Every
GPU-second figure shown next to these views comes from the ledger; the views only say *when* and *where*.
Sizes are bounded so a run of any size sends the browser a few thousand points:

- step progress: at most ``max_points`` points over all attempts (``2,000`` per attempt at most);
- the "where the time went" band: the ledger's own painting (services.analysis.claims), adjacent pieces of one
  category merged, then binned to at most ``max_segments`` pieces when still longer;
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
from math import isfinite

import numpy as np
import pandas as pd

from services.analysis.attempts import RunStructure, build_run_structure
from services.analysis.claims import CLAIM_CATEGORY, Claim, RunPainting, paint_run
from services.analysis.failures import build_failure_causes, last_completed_steps
from services.analysis.grid_figures import grid_consistency, row_figures
from services.analysis.medians import median_of_sorted_rows
from services.analysis.rank_sketch import COMPUTE_ERROR
from services.analysis.run_data import RunData
from services.analysis.step_summary import ComputeGrid, StepSummary, compute_grid
from services.analysis.stragglers import (
    flags_of_consistency,
    rank_consistency,
    rank_hosts,
    step_compute,
)
from services.schemas.categories import WasteCategory
from services.schemas.ledger import Ledger
from services.schemas.views import (
    AllocationSpan,
    AttemptSpan,
    CheckpointRow,
    Failure,
    FailureCause,
    HangSpan,
    Heatmap,
    NoRankCompute,
    Progress,
    ProgressStats,
    RankCompute,
    RankRow,
    Restart,
    RestartRow,
    RunViews,
    Segment,
    Timeline,
)

__all__ = ["build_restart_rows", "build_run_views"]

MAX_POINTS_PER_ATTEMPT = 2000
MAX_POINTS = 20_000
MAX_SEGMENTS = 3000
HEAT_ROWS = 128
HEAT_COLS = 60
MAX_CHECKPOINT_ROWS = 5000
MAX_TIMELINE_ROWS = 500
MAX_RANK_ROWS = 512

_IDLE = WasteCategory.IDLE.value


def build_run_views(
    data: RunData,
    ledger: Ledger,
    *,
    version: int,
    max_points: int = MAX_POINTS,
    max_segments: int = MAX_SEGMENTS,
    heat_rows: int = HEAT_ROWS,
    heat_cols: int = HEAT_COLS,
    painting: RunPainting | None = None,
) -> RunViews:
    """Everything the run page draws besides the ledger's numbers.

    `version`: the run version `data` was loaded at (what the views describe). `painting`: the data's painted
    structure when the caller already built it for the ledger."""
    painting = paint_run(build_run_structure(data)) if painting is None else painting
    run, job_steps = painting.run, painting.job_steps
    attempts = run.attempts

    checkpoints = _checkpoint_rows(run.checkpoints)
    hangs = [
        HangSpan(attempt=a.attempt, start=a.last_step_end, end=a.end, seconds=a.end - a.last_step_end)
        for a in attempts if a.failed and a.last_step_end is not None and a.end > a.last_step_end
    ]
    segments = _segments(painting, max_segments)
    failed = [a for a in attempts if a.failed]
    allocations = [AllocationSpan(start=a.start, end=a.end, gpus=a.gpus, open=a.open)
                   for a in run.allocations[-MAX_TIMELINE_ROWS:]]
    attempt_rows = [
        AttemptSpan(attempt=a.attempt, start=a.start, end=a.end, reason=a.reason, failed=a.failed,
                    world_size=a.world_size, resume_step=a.resume_step, first_step=a.first_step,
                    last_step=a.last_step, first_step_start=a.first_step_start, last_step_end=a.last_step_end)
        for a in attempts[-MAX_TIMELINE_ROWS:]]
    shown_hangs = hangs[-MAX_TIMELINE_ROWS:]
    events = data.events if run.events is None else run.events
    causes = build_failure_causes(events, last_completed_steps(run.steps, data.step_summary),
                                  failed[-MAX_TIMELINE_ROWS:])
    failures = [Failure(attempt=a.attempt, time=a.end, step=a.last_step, reason=a.reason or "lost",
                        cause=causes.get(a.attempt)) for a in failed[-MAX_TIMELINE_ROWS:]]
    restarted = [Restart(attempt=a.attempt, time=a.start, resume_step=a.resume_step)
                 for a in attempts[1:][-MAX_TIMELINE_ROWS:]]
    n_restarted = max(len(attempts) - 1, 0)
    # lists hold the latest rows up to their cap; `<list>_total` says how many there were
    timeline = Timeline(
        allocations=allocations, allocations_total=len(run.allocations),
        allocations_truncated=len(run.allocations) > len(allocations),
        attempts=attempt_rows, attempts_total=len(attempts), attempts_truncated=len(attempts) > len(attempt_rows),
        segments=segments, idle_gaps=[s for s in segments if s.category == _IDLE],
        hangs=shown_hangs, hangs_total=len(hangs), hangs_truncated=len(hangs) > len(shown_hangs),
        failures=failures, failures_total=len(failed), failures_truncated=len(failed) > len(failures),
        restarts=restarted, restarts_total=n_restarted, restarts_truncated=n_restarted > len(restarted),
        progress=_progress(run, job_steps, max_points))
    shown_checkpoints = checkpoints[-MAX_CHECKPOINT_ROWS:]
    restarts = build_restart_rows(ledger, causes)
    shown_restarts = restarts[-MAX_TIMELINE_ROWS:]
    return RunViews(
        run_id=run.run_id,
        status=run.status.value,
        first_time=run.first_time,
        latest_time=run.latest_time,
        timeline=timeline,
        progress=_progress_stats(job_steps, run.checkpoints),
        ranks=_rank_compute(data, run.steps, ledger, heat_rows, heat_cols),
        checkpoints=shown_checkpoints, checkpoints_total=len(checkpoints),
        checkpoints_truncated=len(checkpoints) > len(shown_checkpoints),
        restarts=shown_restarts, restarts_total=len(restarts), restarts_truncated=len(restarts) > len(shown_restarts),
        version=version,
    )


def build_restart_rows(ledger: Ledger, causes: Mapping[int, FailureCause] | None = None) -> list[RestartRow]:
    """One row per restart, from the ledger's attempts; `causes`: why each failed attempt failed, by attempt
    (services.analysis.failures)."""
    return [
        RestartRow(attempt=cur.attempt, time=cur.start,
                   after=prev.reason or ("failed" if prev.failed else "ended"),
                   failed_at_step=prev.last_step, resume_step=cur.resume_step, steps_reworked=prev.steps_reworked,
                   rework_gpu_seconds=float(prev.gpu_seconds.get(WasteCategory.REWORK.value, 0.0)),
                   hang_gpu_seconds=float(prev.gpu_seconds.get(WasteCategory.HANG.value, 0.0)),
                   startup_gpu_seconds=float(cur.gpu_seconds.get(WasteCategory.STARTUP.value, 0.0)),
                   cause=(causes or {}).get(prev.attempt) if prev.failed else None)
        for prev, cur in itertools.pairwise(ledger.attempts)
    ]


# -- timeline --------------------------------------------------------------------------------------------


_SEGMENT_NAMES = np.array([CLAIM_CATEGORY[claim] for claim in Claim] + [_IDLE], dtype=object)
_IDLE_CODE = len(Claim)


def _segments(painting: RunPainting, max_segments: int) -> list[Segment]:
    """The allocated wall time as the ledger painted it: [{start, end, category}], one category each."""
    if not painting.run.allocations or len(painting.bounds) < 2:
        return []
    codes = np.where(painting.claim >= 0, painting.claim, _IDLE_CODE)
    inside = painting.gpus > 0
    starts, ends = painting.bounds[:-1][inside], painting.bounds[1:][inside]
    codes = codes[inside]
    if len(starts) == 0:
        return []
    starts, ends, codes = _merge_runs(starts, ends, codes)
    if len(starts) > max_segments:
        starts, ends, codes = _bin_segments(starts, ends, codes, max_segments, len(_SEGMENT_NAMES))
    return [Segment(start=float(s), end=float(e), category=str(_SEGMENT_NAMES[c]))
            for s, e, c in zip(starts, ends, codes, strict=True)]


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


def _progress(run: RunStructure, job_steps: pd.DataFrame, max_points: int) -> list[Progress]:
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
        out.append(Progress(
            attempt=a.attempt,
            time=pick["end"].astype(float).tolist(),
            step=pick["step"].astype(int).tolist(),
            steps_total=int(n),
            rework_after_step=rework_after,
        ))
    return out


def _progress_stats(job_steps: pd.DataFrame, checkpoints: pd.DataFrame) -> ProgressStats:
    """The usual step time (median gap between consecutive step ends, last 1,000 steps) and the last progress."""
    if job_steps.empty:
        return ProgressStats(median_step_seconds=None, last_progress_time=None, last_step=None)
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
    last = int(job_steps["end"].argmax())  # the position of the step that ended last
    return ProgressStats(median_step_seconds=usual, last_progress_time=last_time,
                         last_step=int(job_steps["step"].to_numpy(np.int64)[last]))


def _checkpoint_rows(checkpoints: pd.DataFrame) -> list[CheckpointRow]:
    if checkpoints.empty:
        return []
    ck = checkpoints.sort_values("start")
    columns = (ck[name].to_numpy() for name in ("attempt", "step", "start", "end", "ok", "torn"))
    return [
        CheckpointRow(attempt=int(attempt), step=int(step), start=float(start), end=float(end),
                      blocking_seconds=float(end - start), ok=bool(ok), torn=bool(torn))
        for attempt, step, start, end, ok, torn in zip(*columns, strict=True)
    ]


# -- per-rank compute ------------------------------------------------------------------------------------


def _rank_compute(data: RunData, steps: pd.DataFrame, ledger: Ledger, heat_rows: int,
                  heat_cols: int) -> RankCompute | NoRankCompute:
    """Per rank: compute seconds per step (duration minus time in collectives), median / p90 / mean.

    `steps`: the run's steps, one row per (attempt, rank, step) (RunStructure.steps); or, when the data carries
    its steps reduced per block (`RunData.step_summary`), the same figures from its compute matrix."""
    by_rank_cost = {int(k): float(v) for k, v in ledger.straggler_gpu_seconds_by_rank.items()}
    summary = data.step_summary
    if (summary.empty if summary is not None else steps.empty):
        return NoRankCompute(rows=[], heatmap=None, compute_source=None, straggler_ranks=[])
    figures: _RankFigures | None
    if summary is not None and summary.sealed is not None:
        figures = _rank_figures_of_sketch(summary, heat_rows, heat_cols)
    elif summary is not None:
        figures = _rank_figures_of_blocks(summary, heat_rows, heat_cols)
        if figures is None:  # not the usual shape (ranks missing from steps, unknown collective time)
            figures = _rank_figures_of_grid(compute_grid(summary), heat_rows, heat_cols)
    else:
        figures = _rank_figures_of_rows(data, steps, heat_rows, heat_cols)
    stats, known_any, consistency, heatmap = figures
    source = "step duration minus collectives" if known_any else "step duration"
    hosts = rank_hosts(data.events)
    clock_of = {c.host: c.offset_seconds for c in ledger.clocks}
    overall = float(stats["median_s"].median())
    total_cost = sum(by_rank_cost.values())
    evidence = flags_of_consistency(  # the flag rule of /stragglers, over the steps with collective timings
        *consistency, {r: v / total_cost for r, v in by_rank_cost.items()} if total_cost > 0 else {})
    stragglers = {r for r, e in evidence.items() if e["flagged"]}
    listed = stats
    if len(stats) > MAX_RANK_ROWS:  # flagged stragglers, then the costliest, then the slowest ranks
        median_of = {int(r): float(m) for r, m in zip(stats.index.to_numpy(np.int64),
                                                      stats["median_s"].to_numpy(np.float64), strict=True)}
        order = sorted(stats.index, key=lambda r: (int(r) not in stragglers, -by_rank_cost.get(int(r), 0.0),
                                                   -median_of[int(r)], int(r)))
        listed = stats.loc[sorted(order[:MAX_RANK_ROWS])]
    rows = [
        RankRow(rank=int(r), host=hosts.get(int(r)), steps=int(n), median_compute_s=float(med),
                p90_compute_s=float(p90), mean_compute_s=float(mean),
                straggler_gpu_seconds=by_rank_cost.get(int(r), 0.0), is_straggler=int(r) in stragglers,
                clock_offset_seconds=clock_of.get(hosts.get(int(r), "")))
        for r, n, med, p90, mean in zip(listed.index, listed["steps"], listed["median_s"], listed["p90_s"],
                                        listed["mean_s"], strict=True)
    ]
    return RankCompute(
        rows=rows,
        rows_total=len(stats),
        rows_truncated=len(stats) > len(listed),
        median_compute_s=overall,
        heatmap=heatmap,
        compute_source=source,
        straggler_ranks=sorted(stragglers),
        figures_within=COMPUTE_ERROR if summary is not None and summary.sealed is not None else None,
        clocks=list(ledger.clocks),
    )


_RankFigures = tuple[pd.DataFrame, bool, tuple[pd.DataFrame, float], Heatmap]


def _rank_figures_of_rows(data: RunData, steps: pd.DataFrame, heat_rows: int, heat_cols: int) -> _RankFigures:
    """(per-rank steps / median / p90 / mean, whether any collective time is known, the flag rule's per-rank
    evidence and yardstick, the heat map) from the step rows."""
    attempt = steps["attempt"].to_numpy(np.int64)
    rank = steps["rank"].to_numpy(np.int64)
    step = steps["step"].to_numpy(np.int64)
    measured = step_compute(data, steps)
    compute, known = measured.seconds, measured.known  # known: the steps with collective timings
    frame = pd.DataFrame({"rank": rank, "step": step, "compute": compute})
    grouped = frame.groupby("rank", sort=True)["compute"]
    stats = pd.DataFrame({
        "steps": grouped.size(),
        "median_s": grouped.median(),
        "p90_s": grouped.quantile(0.9),
        "mean_s": grouped.mean(),
    })
    consistency = rank_consistency(pd.DataFrame({"attempt": attempt[known], "rank": rank[known],
                                                 "step": step[known], "compute": compute[known]}))
    return stats, bool(known.any()), consistency, _heatmap(frame, heat_rows, heat_cols)


def _rank_figures_of_grid(grid: ComputeGrid, heat_rows: int, heat_cols: int) -> _RankFigures:
    """`_rank_figures_of_rows` from the ranks x job steps compute matrix (services.analysis.step_blocks)."""
    values, present, known = grid.compute, ~np.isnan(grid.compute), grid.known
    counts = present.sum(axis=1)
    median, p90, mean = row_figures(values, present)
    stats = pd.DataFrame({"steps": counts, "median_s": median, "p90_s": p90, "mean_s": mean},
                         index=pd.Index(grid.ranks, name="rank"))
    consistency = grid_consistency(grid.ranks, values, known)
    lo_step, hi_step = int(grid.step.min()), int(grid.step.max())
    n_cols = max(1, min(heat_cols, hi_step - lo_step + 1))
    col_edges = np.linspace(lo_step, hi_step + 1, n_cols + 1)
    col = np.clip(np.searchsorted(col_edges, grid.step, side="right") - 1, 0, n_cols - 1)
    one_hot = np.zeros((len(col), n_cols))
    one_hot[np.arange(len(col)), col] = 1.0
    total = np.where(present, values, 0.0) @ one_hot
    count = present.astype(np.float64) @ one_hot
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_cells = total / count
    return stats, bool(known.any()), consistency, _heatmap_of_cells(grid.ranks, mean_cells, col_edges, heat_rows)


def _rank_figures_of_blocks(summary: StepSummary, heat_rows: int, heat_cols: int) -> _RankFigures | None:
    """`_rank_figures_of_grid` in the usual shape, read block by block: every rank reported every step of the run and
    is known in every step where one is (None otherwise). The per-rank evidence of the flag rule comes from each
    block's `excess` (computed once per block, not once per build); sums and counts add up per block; the medians
    and quantiles are taken over every value, as before (sorted rows: numpy's median and quantile of the same
    order statistics)."""
    blocks = summary.blocks
    ranks = blocks[0].ranks
    if len(ranks) < 2 or any(not np.array_equal(b.ranks, ranks) for b in blocks):
        return None
    if any(b.excess is None for b in blocks) or not any(b.known_columns.any() for b in blocks):
        return None
    values = np.concatenate([b.compute for b in blocks], axis=1)
    if np.isnan(values).any():
        return None
    # Matrices of every (rank, step) are made twice (compute, excess) and sorted in place: a fresh array of ten
    # million values costs its page faults again, more than the sort itself.
    mean = values.mean(axis=1)
    values.sort(axis=1)
    median = median_of_sorted_rows(values)
    p90 = np.quantile(values, 0.9, axis=1, overwrite_input=True)  # reorders inside each row only
    stats = pd.DataFrame({"steps": np.full(len(ranks), values.shape[1]), "median_s": median, "p90_s": p90,
                          "mean_s": mean}, index=pd.Index(ranks, name="rank"))
    if all(b.known_columns.all() for b in blocks):  # the same values: the matrix's last use, in any order
        reference = float(np.median(values.reshape(-1), overwrite_input=True))
    else:
        known_values = np.concatenate([b.compute[:, b.known_columns].reshape(-1) for b in blocks])
        reference = float(np.median(known_values, overwrite_input=True))
        del known_values
    del values
    excess = np.concatenate([b.excess for b in blocks if b.excess is not None], axis=1)
    slower = (excess > 0).sum(axis=1)
    excess.sort(axis=1)
    by_rank = pd.DataFrame({"steps": np.full(len(ranks), excess.shape[1]), "slower_steps": slower,
                            "median_excess": median_of_sorted_rows(excess)}, index=pd.Index(ranks, name="rank"))
    del excess
    step = summary.job_steps["step"].to_numpy(np.int64)
    lo_step, hi_step = int(step.min()), int(step.max())
    n_cols = max(1, min(heat_cols, hi_step - lo_step + 1))
    col_edges = np.linspace(lo_step, hi_step + 1, n_cols + 1)
    total = np.zeros((len(ranks), n_cols))
    count = np.zeros(n_cols)
    for b in blocks:  # steps ascend inside a block: its buckets are runs of columns
        col = np.clip(np.searchsorted(col_edges, b.steps, side="right") - 1, 0, n_cols - 1)
        starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
        total[:, col[starts]] += np.add.reduceat(b.compute, starts, axis=1)
        count[col[starts]] += np.diff(np.r_[starts, len(col)])
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_cells = total / count
    heatmap = _heatmap_of_cells(ranks, mean_cells, col_edges, heat_rows)
    return stats, True, (by_rank, reference), heatmap


def _rank_figures_of_sketch(summary: StepSummary, heat_rows: int, heat_cols: int) -> _RankFigures:
    """`_rank_figures_of_grid` of a long run: its sealed sketch with the open blocks added (median, p90 and median
    excess to within services.analysis.rank_sketch's bounds; counts exact)."""
    assert summary.sealed is not None
    sketch = summary.sealed.copy()
    for b in summary.blocks:
        sketch.add_block(b)
    step = summary.job_steps["step"].to_numpy(np.int64)
    lo_step, hi_step = int(step.min()), int(step.max())
    n_cols = max(1, min(heat_cols, hi_step - lo_step + 1))
    col_edges = np.linspace(lo_step, hi_step + 1, n_cols + 1)
    figures = sketch.figures(col_edges)
    heatmap = _heatmap_of_cells(sketch.ranks, figures.heat_mean, col_edges, heat_rows)
    return figures.stats, figures.known_any, figures.consistency, heatmap


def _heatmap(frame: pd.DataFrame, heat_rows: int, heat_cols: int) -> Heatmap:
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
    return _heatmap_of_cells(ranks, mean, col_edges, heat_rows)


def _heatmap_of_cells(ranks: np.ndarray, mean: np.ndarray, col_edges: np.ndarray, heat_rows: int) -> Heatmap:
    """The heat map from the mean compute per (rank, step bucket)."""
    n_cols = len(col_edges) - 1
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
    return Heatmap(
        rank_labels=labels,
        ranks_per_row=group,
        step_centers=step_labels,
        step_edges=[float(x) for x in col_edges],
        # Python floats first (tolist): a numpy scalar's isfinite and float() cost more than the rounding itself
        z=[[round(v, 6) if isfinite(v) else None for v in row] for row in grid.tolist()],
    )
