"""Stragglers: per-rank compute per step, what waiting for the slowest rank cost, and who was slow.

compute = a rank's step duration minus its time inside collectives (the step's own `comm`, else the sum of its
collective rows). Only kept steps count, and only steps where at least two ranks reported compute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from services.analysis.attempts import RunStructure
from services.analysis.run_data import RunData

SLOW_FACTOR = 1.10  # a rank is slow in a step when its compute exceeds the step's median by this factor
PERSISTENT_SHARE = 0.5  # slow in at least this share of steps: persistent; otherwise sporadic
FLAG_SHARE = 0.10  # flag a rank or host that caused at least this share of the straggler GPU-seconds


def rank_compute(run: RunStructure, data: RunData, kept: pd.DataFrame) -> pd.DataFrame:
    """(attempt, rank, step, compute) for kept steps whose collective time is known."""
    steps = run.steps
    if steps.empty or kept.empty:
        return pd.DataFrame(columns=["attempt", "rank", "step", "compute"])
    frame = steps[["attempt", "rank", "step", "start", "end", "comm"]]
    comm = _comm_seconds(data.collectives) if data.comm is None else data.comm.rename(columns={"seconds": "coll_s"})
    if comm is not None and not comm.empty:
        frame = frame.merge(comm, on=["attempt", "rank", "step"], how="left")
        # A step's own `comm` (the client sums its collectives) wins; collective rows fill the rest.
        frame["comm"] = frame["comm"].where(frame["comm"].notna(), frame["coll_s"])
    frame = frame[frame["comm"].notna()].merge(kept[["attempt", "step"]], on=["attempt", "step"], how="inner")
    compute = (frame["end"] - frame["start"] - frame["comm"]).clip(lower=0.0)
    return pd.DataFrame({"attempt": frame["attempt"].to_numpy(), "rank": frame["rank"].to_numpy(),
                         "step": frame["step"].to_numpy(), "compute": compute.to_numpy()})


def step_straggle(run: RunStructure, compute: pd.DataFrame, gpus_by_attempt: Mapping[int, int]) -> pd.DataFrame:
    """Per kept step: slowest and median compute, the slowest rank, and the cost
    (slowest - median) x the GPUs the attempt counts on."""
    columns = ["attempt", "step", "slowest", "median", "ranks", "rank", "cost"]
    if compute.empty:
        return pd.DataFrame(columns=columns)
    grouped = compute.groupby(["attempt", "step"], sort=False)["compute"]
    stats = pd.DataFrame({"slowest": grouped.max(), "median": grouped.median(), "ranks": grouped.size()})
    stats = stats.join(compute.loc[grouped.idxmax(), ["attempt", "step", "rank"]].set_index(["attempt", "step"]))
    stats = stats[stats["ranks"] >= 2].reset_index()
    on_gpus = stats["attempt"].map(gpus_by_attempt).to_numpy(dtype=np.float64)
    stats["cost"] = (stats["slowest"] - stats["median"]).to_numpy() * on_gpus
    return stats[columns]


def _comm_seconds(collectives: pd.DataFrame) -> pd.DataFrame | None:
    if collectives.empty:
        return None  # no collective timings: straggler cost cannot be seen
    unique = collectives.drop_duplicates(["attempt", "rank", "step", "op", "start"])
    seconds = (unique["end"] - unique["start"]).groupby(
        [unique["attempt"], unique["rank"], unique["step"]]).sum()
    return seconds.rename("coll_s").reset_index()


def culprits(compute: pd.DataFrame, straggle: pd.DataFrame, hosts: Mapping[int, str], *,
             straggler_gpu_seconds: float, slow_factor: float = SLOW_FACTOR) -> dict[str, Any]:
    """Per rank and per host: GPU-seconds caused, how often slow / slowest, persistent or sporadic, flagged."""
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
    ranks = []
    for rank, row in by_rank.iterrows():
        cost = float(row["cost"]) * scale
        share = cost / straggler_gpu_seconds if straggler_gpu_seconds > 0 else 0.0
        slow_share = float(row["slow_steps"]) / float(row["steps"]) if row["steps"] else 0.0
        ranks.append({
            "rank": int(rank), "host": hosts.get(int(rank)), "straggler_gpu_seconds": cost, "share": share,
            "slowest_steps": int(row["slowest_steps"]), "slow_steps": int(row["slow_steps"]),
            "steps": int(row["steps"]), "slow_step_share": slow_share,
            "pattern": _pattern(slow_share), "flagged": share >= FLAG_SHARE and cost > 0,
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
        h = hosts.setdefault(host, {"host": host, "ranks": [], "straggler_gpu_seconds": 0.0, "slowest_steps": 0})
        h["ranks"].append(r["rank"])
        h["straggler_gpu_seconds"] += r["straggler_gpu_seconds"]
        h["slowest_steps"] += r["slowest_steps"]
    out = sorted(hosts.values(), key=lambda h: -h["straggler_gpu_seconds"])
    for h in out:
        h["share"] = h["straggler_gpu_seconds"] / total if total > 0 else 0.0
        h["flagged"] = h["share"] >= FLAG_SHARE and h["straggler_gpu_seconds"] > 0
        h["ranks"].sort()
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

