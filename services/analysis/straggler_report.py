"""A run's straggler culprits and the projected cost at other scales, consistent with its ledger."""

from __future__ import annotations

from services.analysis.attempts import build_run_structure
from services.analysis.claims import kept_job_steps
from services.analysis.ledger import gpus_counted
from services.analysis.run_data import RunData
from services.analysis.stragglers import (
    DEFAULT_FLAG_RULE,
    PERSISTENT_SHARE,
    SLOW_FACTOR,
    culprits,
    projection,
    rank_compute,
    rank_hosts,
    step_straggle,
)
from services.schemas.ledger import Ledger
from services.schemas.stragglers import (
    ScaleProjection,
    StragglerHost,
    StragglerRank,
    StragglerReport,
    StragglerThresholds,
)


def build_straggler_report(data: RunData, ledger: Ledger) -> StragglerReport:
    """Straggler culprits of one run and the projected cost at other scales, consistent with its ledger."""
    run = build_run_structure(data)
    job_steps = kept_job_steps(run)
    compute = rank_compute(run, data, job_steps.loc[job_steps["kept"]] if not job_steps.empty else job_steps)
    straggle = step_straggle(run, compute, gpus_counted(run))
    total = ledger.waste_gpu_seconds.straggler
    found = culprits(compute, straggle, rank_hosts(data.events), straggler_gpu_seconds=total)
    world = max((a.world_size for a in run.attempts), default=0)
    allocated = ledger.allocated_gpu_seconds
    rows = projection(found["slow_step_probability"], found["slowdown"], sorted({8, 64, 512, 4096, 16384, world} - {0}))
    return StragglerReport(
        run_id=data.run_id, straggler_gpu_seconds=total, straggler_share=total / allocated if allocated else 0.0,
        world_size=world,
        ranks=[StragglerRank.model_validate(rank) for rank in found["ranks"]],
        hosts=[StragglerHost.model_validate(host) for host in found["hosts"]],
        steps=found["steps"], slow_step_probability=found["slow_step_probability"], slowdown=found["slowdown"],
        slow_factor=found["slow_factor"],
        projection=[ScaleProjection.model_validate(row) for row in rows],
        thresholds=StragglerThresholds.model_validate({"slow_factor": SLOW_FACTOR, "persistent_share": PERSISTENT_SHARE,
                                                       **DEFAULT_FLAG_RULE.as_dict()}),
    )
