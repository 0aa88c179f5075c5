"""A run's straggler culprits and the projected cost at other scales, consistent with its ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from services.analysis.attempts import build_run_structure
from services.analysis.ledger import gpus_counted, kept_mask
from services.analysis.run_data import RunData
from services.analysis.stragglers import (
    DEFAULT_FLAG_RULE,
    PERSISTENT_SHARE,
    SLOW_FACTOR,
    culprits,
    projection,
    rank_compute,
    step_straggle,
)


def rank_hosts(events: pd.DataFrame) -> dict[int, str]:
    """Each rank's host, from its latest attempt_start."""
    starts = events[(events["kind"] == "attempt_start") & events["host"].notna()].sort_values("time")
    return {int(r): str(h) for r, h in zip(starts["rank"], starts["host"])}


def build_straggler_report(data: RunData, ledger: Mapping[str, Any]) -> dict[str, Any]:
    """Straggler culprits of one run and the projected cost at other scales, consistent with its ledger."""
    run = build_run_structure(data)
    job_steps = run.job_steps.copy()
    position = {a.attempt: i for i, a in enumerate(run.attempts)}
    if not job_steps.empty:
        job_steps["pos"] = job_steps["attempt"].map(position).astype(np.int64)
    job_steps["kept"] = kept_mask(run, job_steps) if not job_steps.empty else []
    compute = rank_compute(run, data, job_steps.loc[job_steps["kept"]] if not job_steps.empty else job_steps)
    straggle = step_straggle(run, compute, gpus_counted(run))
    total = float(ledger["waste_gpu_seconds"]["straggler"])
    found = culprits(compute, straggle, rank_hosts(data.events), straggler_gpu_seconds=total)
    world = max((a.world_size for a in run.attempts), default=0)
    return {
        "run_id": data.run_id, "straggler_gpu_seconds": total,
        "straggler_share": total / ledger["allocated_gpu_seconds"] if ledger["allocated_gpu_seconds"] else 0.0,
        "world_size": world, **found,
        "projection": projection(found["slow_step_probability"], found["slowdown"],
                                 sorted({8, 64, 512, 4096, 16384, world} - {0})),
        "thresholds": {"slow_factor": SLOW_FACTOR, "persistent_share": PERSISTENT_SHARE,
                       **DEFAULT_FLAG_RULE.as_dict()},
    }
