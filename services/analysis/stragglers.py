"""Stragglers: per-rank compute per step, what waiting for the slowest rank cost, and who was slow.

compute = a rank's step duration minus its time inside collectives (the step's own `comm`, else the sum of its
collective rows). Only kept steps count, and only steps where at least two ranks reported compute.

Who is *flagged* (docs/ledger.md, "Straggler"): a rank that is consistently slower than the others, not merely
the one charged with most of the straggler cost (with two ranks, one of them always carries over half of it):

1. it reported compute in at least ``min_steps`` kept steps with collective timings;
2. its compute exceeds the median of the *other* ranks' compute in at least ``consistent_share`` of them;
3. that many slower steps are not chance: under "no rank is special" each rank is above the others' median with
   probability 1/2 per step, and P(Binomial(n, 1/2) >= slower steps) must be below ``family_alpha`` divided by
   the number of ranks (Bonferroni over the ranks tested);
4. its median excess over the others' median is material: at least ``material_excess`` of the median compute;
5. it carries at least ``flag_share`` of the straggler GPU-seconds, and some.

A host is flagged when one of its ranks is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from services.analysis.attempts import RunStructure
from services.analysis.collective_time import calls_seconds, step_collective_seconds
from services.analysis.medians import others_median, others_median_by_step
from services.analysis.run_data import RunData

SLOW_FACTOR = 1.10  # a rank is slow in a step when its compute exceeds the step's median by this factor
PERSISTENT_SHARE = 0.5  # slow in at least this share of steps: persistent; otherwise sporadic
FLAG_SHARE = 0.10  # a flagged rank caused at least this share of the straggler GPU-seconds (and more, below)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagRule:
    """When a rank is flagged as a straggler (module docstring); the defaults are the documented rule."""

    min_steps: int = 20  # kept steps with collective timings the rank must have reported
    consistent_share: float = 0.75  # slower than the others' median in at least this share of those steps
    family_alpha: float = 0.01  # chance of flagging any rank of a run with no special rank, at most
    material_excess: float = 0.05  # median excess over the others' median, as a share of the median compute
    flag_share: float = FLAG_SHARE  # share of the straggler GPU-seconds the rank carries, at least

    def __post_init__(self) -> None:
        if self.min_steps < 1:
            raise ValueError(f"FlagRule.min_steps must be at least 1, got {self.min_steps}")
        for name in ("consistent_share", "family_alpha", "material_excess", "flag_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FlagRule.{name} must be between 0 and 1, got {value}")

    def as_dict(self) -> dict[str, float]:
        return {"min_steps": self.min_steps, "consistent_share": self.consistent_share,
                "family_alpha": self.family_alpha, "material_excess": self.material_excess,
                "flag_share": self.flag_share}


DEFAULT_FLAG_RULE = FlagRule()


@dataclass(frozen=True, slots=True)
class StepCompute:
    """Per row of a run's steps (one per attempt, rank and step): its compute seconds, and whether the collective
    time subtracted from its duration is known (where it is not, compute is the whole step)."""

    seconds: np.ndarray
    known: np.ndarray


def step_compute(data: RunData, steps: pd.DataFrame) -> StepCompute:
    """compute = step duration - time inside collectives (module docstring), for every row of `steps`."""
    comm = step_collective_seconds(steps, calls_seconds(data.collectives) if data.comm is None else data.comm)
    known = ~np.isnan(comm)
    duration = (steps["end"] - steps["start"]).to_numpy(np.float64)
    return StepCompute(seconds=np.clip(duration - np.where(known, comm, 0.0), 0.0, None), known=known)


def rank_compute(run: RunStructure, data: RunData, kept: pd.DataFrame) -> pd.DataFrame:
    """(attempt, rank, step, compute) for kept steps whose collective time is known."""
    steps = run.steps
    if steps.empty or kept.empty:
        return pd.DataFrame(columns=["attempt", "rank", "step", "compute"])
    compute = step_compute(data, steps)
    frame = steps[["attempt", "rank", "step"]].assign(compute=compute.seconds)
    if not compute.known.all():
        frame = frame[compute.known]
    return frame.merge(kept[["attempt", "step"]], on=["attempt", "step"], how="inner")


def rank_hosts(events: pd.DataFrame) -> dict[int, str]:
    """Each rank's host, from its latest attempt_start."""
    started = events[(events["kind"] == "attempt_start") & events["rank"].notna() & events["host"].notna()]
    if started.empty:
        return {}
    last = started.sort_values("time").drop_duplicates("rank", keep="last")
    return {int(r): str(h) for r, h in zip(last["rank"], last["host"], strict=True)}


def step_straggle(run: RunStructure, compute: pd.DataFrame, gpus_by_attempt: Mapping[int, int]) -> pd.DataFrame:
    """Per kept step: slowest and median compute, the slowest rank, and the cost
    (slowest - median) x the GPUs the attempt counts on."""
    columns = ["attempt", "step", "slowest", "median", "ranks", "rank", "cost"]
    if compute.empty:
        return pd.DataFrame(columns=columns)
    values = compute["compute"].to_numpy(np.float64)
    if np.isnan(values).any():  # pandas skips them
        grouped = compute.groupby(["attempt", "step"], sort=False)["compute"]
        stats = pd.DataFrame({"slowest": grouped.max(), "median": grouped.median(), "ranks": grouped.size()})
        stats = stats.join(compute.loc[grouped.idxmax(), ["attempt", "step", "rank"]].set_index(["attempt", "step"]))
        stats = stats[stats["ranks"] >= 2].reset_index()
    else:
        stats = _step_stats(compute["attempt"].to_numpy(np.int64), compute["step"].to_numpy(np.int64),
                            compute["rank"].to_numpy(np.int64), values)
    on_gpus = stats["attempt"].map(gpus_by_attempt).to_numpy(dtype=np.float64)
    stats["cost"] = (stats["slowest"] - stats["median"]).to_numpy() * on_gpus
    return stats[columns]


def _step_stats(attempt: np.ndarray, step: np.ndarray, rank: np.ndarray, values: np.ndarray) -> pd.DataFrame:
    """Per (attempt, step) of two ranks or more, in the order they first appear: slowest and median compute, ranks,
    and the rank of the first slowest row: what pandas' groupby max / median / size / idxmax give, computed on the
    steps of each size as one (steps x ranks) matrix."""
    order = np.lexsort((step, attempt))  # stable: a step's rows keep their order
    a, s, v = attempt[order], step[order], values[order]
    first = np.flatnonzero(np.r_[True, (a[1:] != a[:-1]) | (s[1:] != s[:-1])])
    sizes = np.diff(np.r_[first, len(v)])
    slowest, median = np.empty(len(first)), np.empty(len(first))
    slowest_row = np.empty(len(first), dtype=np.int64)
    for size in np.unique(sizes).tolist():
        groups = np.flatnonzero(sizes == size)
        rows = first[groups][:, None] + np.arange(size)
        matrix = v[rows]
        slowest[groups] = matrix.max(axis=1)
        median[groups] = np.median(matrix, axis=1)  # of an even count: (a + b) / 2, as pandas' median
        slowest_row[groups] = order[rows[np.arange(len(groups)), matrix.argmax(axis=1)]]  # the first of equals
    shown = np.argsort(order[first], kind="stable")  # by their first row (a stable sort keeps it first)
    shown = shown[sizes[shown] >= 2]
    return pd.DataFrame({"attempt": a[first][shown], "step": s[first][shown], "slowest": slowest[shown],
                         "median": median[shown], "ranks": sizes[shown].astype(np.int64),
                         "rank": rank[slowest_row][shown]})


def summary_straggle(straggle: pd.DataFrame, kept: np.ndarray, gpus_by_attempt: Mapping[int, int]) -> pd.DataFrame:
    """`step_straggle` from the per-step statistics of services.analysis.step_blocks (one row per job step, in
    the job steps' order; `kept`: whether each was kept): the kept steps where at least two ranks' compute is
    known."""
    stats = straggle[kept & (straggle["known"].to_numpy(np.int64) >= 2)].rename(columns={"known": "ranks"})
    stats = stats.reset_index(drop=True)
    on_gpus = stats["attempt"].map(gpus_by_attempt).to_numpy(dtype=np.float64)
    stats["cost"] = (stats["slowest"] - stats["median"]).to_numpy() * on_gpus
    return stats[["attempt", "step", "slowest", "median", "ranks", "rank", "cost"]]


def binomial_tail_half(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), in floating point (relative error ~1e-12), in O(terms that matter)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if 2 * k <= n:  # the tail is at least 1/2: its complement is the short upper tail, by symmetry
        return 1.0 - binomial_tail_half(n - k + 1, n)
    term = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0))
    total, i = 0.0, k
    while i <= n and term > 0.0:  # terms fall at least geometrically above the mean
        total += term
        if term < total * 1e-17:
            break
        term *= (n - i) / (i + 1)
        i += 1
    return min(total, 1.0)


def rank_consistency(compute: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """Per rank: steps compared, steps slower than the others' median, median excess over it (seconds);
    and the median compute of all (rank, step) rows, the yardstick of "material".

    `compute`: (attempt, rank, step, compute) as from `rank_compute`. Rows sorted by rank with every rank
    reporting the same (attempt, step) sequence (the usual shape) take a fast path without a sort."""
    columns = ["steps", "slower_steps", "median_excess"]
    if compute.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="rank")), 0.0
    values = compute["compute"].to_numpy(np.float64)
    matrix = _as_step_by_rank(compute)
    if matrix is not None:
        return consistency_of_grid(*matrix), float(np.median(values))
    group = compute.groupby(["attempt", "step"], sort=False).ngroup().to_numpy(np.int64)
    median_others = others_median(group, values)
    compared = ~np.isnan(median_others)
    excess = values[compared] - median_others[compared]
    frame = pd.DataFrame({"rank": compute["rank"].to_numpy(np.int64)[compared], "excess": excess,
                          "slower": excess > 0})
    by_rank = frame.groupby("rank").agg(steps=("slower", "size"), slower_steps=("slower", "sum"),
                                        median_excess=("excess", "median"))
    return by_rank[columns], float(np.median(values))


def consistency_of_grid(ranks: np.ndarray, grid: np.ndarray) -> pd.DataFrame:
    """`rank_consistency`'s per-rank figures for a (steps x ranks) matrix where every rank reported every step."""
    if grid.shape[1] < 2:
        return pd.DataFrame(columns=["steps", "slower_steps", "median_excess"], index=pd.Index([], name="rank"))
    excess = grid - others_median_by_step(grid)
    return pd.DataFrame({"steps": np.full(len(ranks), grid.shape[0]), "slower_steps": (excess > 0).sum(axis=0),
                         "median_excess": np.median(excess, axis=0)}, index=pd.Index(ranks, name="rank"))


def _as_step_by_rank(compute: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """(ranks, steps x ranks matrix) when rows are sorted by rank and each rank has the same steps in the same
    order; else None."""
    rank = compute["rank"].to_numpy(np.int64)
    if len(rank) > 1 and not bool(np.all(rank[:-1] <= rank[1:])):
        return None
    ranks, counts = np.unique(rank, return_counts=True)
    if not bool(np.all(counts == counts[0])):
        return None
    shape = (len(ranks), int(counts[0]))
    for column in ("attempt", "step"):
        block = compute[column].to_numpy(np.int64).reshape(shape)
        if not bool(np.all(block == block[0])):
            return None
    return ranks, compute["compute"].to_numpy(np.float64).reshape(shape).T


def flagged_ranks(compute: pd.DataFrame, cost_share: Mapping[int, float] | None = None,
                  rule: FlagRule = DEFAULT_FLAG_RULE) -> dict[int, dict[str, Any]]:
    """Per rank: the evidence of the flag rule (module docstring) and whether the rank is flagged.

    `cost_share`: each rank's share of the straggler GPU-seconds; None skips condition 5 (a caller that has no
    ledger at hand, e.g. a view drawn from compute alone)."""
    by_rank, reference = rank_consistency(compute)
    return flags_of_consistency(by_rank, reference, cost_share, rule)


def flags_of_consistency(by_rank: pd.DataFrame, reference: float, cost_share: Mapping[int, float] | None = None,
                         rule: FlagRule = DEFAULT_FLAG_RULE) -> dict[int, dict[str, Any]]:
    """`flagged_ranks` from `rank_consistency`'s answer."""
    alpha = rule.family_alpha / max(len(by_rank), 1)
    out: dict[int, dict[str, Any]] = {}
    rows = zip(by_rank.index.to_numpy(np.int64), by_rank["steps"].to_numpy(np.int64),
               by_rank["slower_steps"].to_numpy(np.int64), by_rank["median_excess"].to_numpy(np.float64), strict=True)
    tails: dict[tuple[int, int], float] = {}  # ranks of one run share most (slower, steps) pairs
    for rank, rank_steps, rank_slower, rank_excess in rows:
        steps, slower = int(rank_steps), int(rank_slower)
        chance = tails.get((slower, steps))
        if chance is None:
            chance = tails[(slower, steps)] = binomial_tail_half(slower, steps)
        median_excess = float(rank_excess)
        share = None if cost_share is None else float(cost_share.get(int(rank), 0.0))
        flagged = (steps >= rule.min_steps and slower >= rule.consistent_share * steps and chance < alpha
                   and median_excess > 0 and median_excess >= rule.material_excess * reference
                   and (share is None or (share >= rule.flag_share and share > 0)))
        out[int(rank)] = {"compared_steps": steps, "slower_steps": slower,
                          "slower_step_share": slower / steps if steps else 0.0, "chance_p": chance,
                          "median_excess_seconds": median_excess,
                          "median_excess_share": median_excess / reference if reference > 0 else None,
                          "flagged": bool(flagged)}
    return out


def culprits(compute: pd.DataFrame, straggle: pd.DataFrame, hosts: Mapping[int, str], *,
             straggler_gpu_seconds: float, slow_factor: float = SLOW_FACTOR,
             rule: FlagRule = DEFAULT_FLAG_RULE) -> dict[str, Any]:
    """Per rank and per host: GPU-seconds caused, how often slow / slowest / slower than the others,
    persistent or sporadic, flagged (module docstring)."""
    if compute.empty or straggle.empty:
        return {"ranks": [], "hosts": [], "slow_step_probability": None, "slowdown": None,
                "steps": 0, "slow_factor": slow_factor}
    medians = straggle.set_index(["attempt", "step"])["median"]
    frame = compute.join(medians, on=["attempt", "step"], how="inner")
    frame["slow"] = frame["compute"] > slow_factor * frame["median"]
    steps = len(straggle)
    by_rank = frame.groupby("rank").agg(steps=("slow", "size"), slow_steps=("slow", "sum"),
                                        mean_compute=("compute", "mean"))
    slowest = straggle.groupby("rank").agg(slowest_steps=("cost", "size"), cost=("cost", "sum"))
    by_rank = by_rank.join(slowest, how="left").fillna({"slowest_steps": 0, "cost": 0.0})
    # the ledger may scale straggler cost down (overlapping steps): rank shares follow it
    scale = straggler_gpu_seconds / float(straggle["cost"].sum()) if float(straggle["cost"].sum()) > 0 else 0.0
    rank_index = by_rank.index.to_numpy(np.int64)
    costs = {int(rank): float(cost) * scale
             for rank, cost in zip(rank_index, by_rank["cost"].to_numpy(np.float64), strict=True)}
    shares = {r: c / straggler_gpu_seconds if straggler_gpu_seconds > 0 else 0.0 for r, c in costs.items()}
    evidence = flagged_ranks(frame[["attempt", "rank", "step", "compute"]], shares, rule)
    ranks = []
    counts = (by_rank[c].to_numpy(np.int64) for c in ("slowest_steps", "slow_steps", "steps"))
    for rank, slowest_steps, slow_steps, steps_seen in zip(rank_index, *counts, strict=True):
        cost, share = costs[int(rank)], shares[int(rank)]
        slow_share = float(slow_steps) / float(steps_seen) if steps_seen else 0.0
        ranks.append({
            "rank": int(rank), "host": hosts.get(int(rank)), "straggler_gpu_seconds": cost, "share": share,
            "slowest_steps": int(slowest_steps), "slow_steps": int(slow_steps),
            "steps": int(steps_seen), "slow_step_share": slow_share, "pattern": _pattern(slow_share),
            **evidence.get(int(rank), {"compared_steps": 0, "slower_steps": 0, "slower_step_share": 0.0,
                                       "chance_p": 1.0, "median_excess_seconds": 0.0,
                                       "median_excess_share": None, "flagged": False}),
        })
    ranks.sort(key=lambda r: -r["straggler_gpu_seconds"])
    slow = frame[frame["slow"]]
    slowdown = float((slow["compute"] / slow["median"]).mean()) if not slow.empty else None
    return {
        "ranks": ranks, "hosts": _hosts_table(ranks, straggler_gpu_seconds), "steps": steps,
        "slow_step_probability": float(frame["slow"].mean()), "slowdown": slowdown, "slow_factor": slow_factor,
    }


def _pattern(slow_share: float) -> str:
    if slow_share >= PERSISTENT_SHARE:
        return "persistent"
    return "sporadic" if slow_share > 0 else "never"


def _hosts_table(ranks: Iterable[dict[str, Any]], total: float) -> list[dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = {}
    for r in ranks:
        host = r["host"] or "unknown"
        h = hosts.setdefault(host, {"host": host, "ranks": [], "straggler_gpu_seconds": 0.0, "slowest_steps": 0,
                                    "flagged_ranks": []})
        h["ranks"].append(r["rank"])
        if r["flagged"]:
            h["flagged_ranks"].append(r["rank"])
        h["straggler_gpu_seconds"] += r["straggler_gpu_seconds"]
        h["slowest_steps"] += r["slowest_steps"]
    out = sorted(hosts.values(), key=lambda h: -h["straggler_gpu_seconds"])
    for h in out:
        h["share"] = h["straggler_gpu_seconds"] / total if total > 0 else 0.0
        h["flagged"] = bool(h["flagged_ranks"])  # a host is flagged when one of its ranks is
        h["ranks"].sort()
        h["flagged_ranks"].sort()
    return out


def projected_step_factor(p: float, n: int, slowdown: float = 2.0) -> float:
    """Expected step time relative to a step with no slow rank, when each of n ranks is independently slow
    (compute x slowdown) with probability p: 1 + (slowdown - 1)(1 - (1 - p)^n)."""
    return 1.0 + (slowdown - 1.0) * (1.0 - (1.0 - p) ** n)


def projection(p: float | None, slowdown: float | None, scales: Iterable[int] = (8, 64, 512, 4096, 16384)
               ) -> list[dict[str, float]]:
    if p is None:
        return []
    s = slowdown if slowdown is not None else 2.0
    rows = []
    for n in scales:
        factor = projected_step_factor(p, n, s)
        rows.append({"ranks": n, "step_time_factor": factor, "straggler_share": 1.0 - 1.0 / factor})
    return rows

