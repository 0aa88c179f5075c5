"""`goodput db prune`'s report: what retention deleted (or, with --dry-run, would delete) and what it kept."""

from __future__ import annotations

import time

from services.derive.retention import PruneResult


def prune_lines(result: PruneResult, *, days: float, dry_run: bool) -> list[str]:
    lines = [f"created partition {name}" for name in result.partitions_created]
    if result.cutoff is None:
        return [*lines, "retention is off (GOODPUT_RAW_RETENTION_DAYS=0): raw rows are kept forever"]
    cutoff = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(result.cutoff))
    plan = result.plan
    assert plan is not None
    would = "would " if dry_run else ""
    lines.append(f"retention {days:g} days: runs quiet since before {cutoff} lose their raw rows; their ledger, "
                 "views, straggler report and resume check are kept")
    if dry_run:
        lines += [f"{would}prune run {run_id}" for run_id in result.candidates] or ["no run to prune"]
        lines += [f"{would}drop partition {name}" for name in plan.partitions]
        return lines
    pruned = result.pruned
    assert pruned is not None
    lines += [f"pruned run {run_id} (analyses stored)" for run_id in result.frozen]
    lines += [f"dropped partition {name}" for name in pruned.partitions_dropped]
    if pruned.rows_kept:
        lines.append(f"kept {pruned.rows_kept} rows of runs still going (moved to the default partition)")
    lines += [f"deleted {n} rows of {table}" for table, n in pruned.rows_deleted.items()]
    lines += [f"left run {run_id} whole: its analysis failed or it received events meanwhile (see the log); the "
              "next prune tries again" for run_id in result.left_whole]
    if not (result.frozen or pruned.partitions_dropped or pruned.rows_deleted):
        lines.append("nothing to prune")
    return lines
