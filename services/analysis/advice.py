"""Checkpoint-interval advice for one run, from its ledger (and the fleet's, when the run failed too rarely).

Inputs are typed ledgers; no I/O. The advice is served as `GET /v1/runs/{id}/advice`'s `checkpoint_interval`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from services.analysis.categories import WasteCategory
from services.analysis.interval import daly_interval, first_order_goodput, first_order_waste, young_interval
from services.analysis.ledger_types import Ledger

MIN_FAILURES = 3  # fewer failures than this in the run: take the failure rate from similar runs


class AdviceInputs(BaseModel):
    checkpoint_seconds: float | None = Field(description="median seconds one checkpoint blocked the loop")
    restart_seconds: float = Field(description="wall seconds from a failure to useful work again, per failure")
    mtbf_seconds: float | None
    mtbf_source: str
    current_interval_seconds: float | None = Field(description="compute seconds between two checkpoints now")
    seconds_per_step: float | None


class IntervalOption(BaseModel):
    name: str = Field(description="current, young or daly")
    interval_seconds: float
    interval_steps: float | None
    expected_waste: float = Field(description="first-order model: waste per unit of useful work")
    expected_goodput: float


class CheckpointAdvice(BaseModel):
    inputs: AdviceInputs
    intervals: list[IntervalOption] = Field(description="empty when no checkpoint or no failure rate is known")
    summary: str

    def option(self, name: str) -> IntervalOption | None:
        return next((row for row in self.intervals if row.name == name), None)


def world_size(ledger: Ledger) -> int:
    return max((a.world_size for a in ledger.attempts), default=0)


def restart_seconds(ledger: Ledger) -> float | None:
    """Wall seconds from a failure to useful work again: detection (hang) plus restart (startup of the
    attempts that followed a failure), per failure."""
    attempts = ledger.attempts
    if not ledger.failures or len(attempts) < 2:
        return None
    gpu_s = sum(a.gpu_seconds.get(WasteCategory.STARTUP.value, 0.0) for a in attempts[1:])
    gpu_s += sum(a.gpu_seconds.get(WasteCategory.HANG.value, 0.0) for a in attempts)
    world = world_size(ledger) or 1
    return gpu_s / world / ledger.failures


def failure_rate(ledger: Ledger, fleet: Iterable[Ledger]) -> tuple[float | None, str]:
    """MTBF in seconds and where it came from."""
    failures = ledger.failures
    if failures >= MIN_FAILURES and ledger.mtbf_seconds:
        return float(ledger.mtbf_seconds), f"this run ({failures} failures)"
    size = world_size(ledger)
    similar = [r for r in fleet if r.run_id != ledger.run_id and size and size / 2 <= world_size(r) <= size * 2]
    fleet_failures = sum(r.failures for r in similar) + failures
    wall = sum(r.allocated_wall_seconds for r in similar) + ledger.allocated_wall_seconds
    if fleet_failures >= MIN_FAILURES and wall > 0:
        return wall / fleet_failures, (f"{len(similar)} runs of {max(size // 2, 1)}-{size * 2} ranks in the fleet "
                                       f"plus this one ({fleet_failures} failures in {wall / 3600:.1f} h)")
    if failures and ledger.mtbf_seconds:
        return float(ledger.mtbf_seconds), f"this run only ({failures} failure(s): a rough estimate)"
    return None, "no failures observed in this run or in similar runs"


def checkpoint_advice(ledger: Ledger, fleet: Iterable[Ledger] = ()) -> CheckpointAdvice:
    delta = ledger.checkpoints.median_blocking_seconds
    every_s = ledger.checkpoints.median_interval_seconds
    every_steps = ledger.checkpoints.median_interval_steps
    mtbf, source = failure_rate(ledger, list(fleet))
    restart = restart_seconds(ledger)
    if restart is None:
        restart = 0.0
    current = max(every_s - delta, 1e-9) if every_s is not None and delta is not None else None
    step_s = (current / every_steps) if current and every_steps else None  # compute seconds per step
    inputs = AdviceInputs(checkpoint_seconds=delta, restart_seconds=restart, mtbf_seconds=mtbf, mtbf_source=source,
                          current_interval_seconds=current, seconds_per_step=step_s)
    if delta is None:
        return CheckpointAdvice(inputs=inputs, intervals=[], summary=(
            "the run wrote no checkpoint: every failure restarts it from the beginning; checkpoint periodically"))
    if mtbf is None:
        return CheckpointAdvice(inputs=inputs, intervals=[], summary=(
            f"{source}: the interval barely matters until failures happen; keep it where blocking stays small "
            f"(now {delta:.1f} s per checkpoint)"))
    rows = [
        IntervalOption(name=name, interval_seconds=interval, interval_steps=interval / step_s if step_s else None,
                       expected_waste=first_order_waste(interval, delta, restart, mtbf),
                       expected_goodput=first_order_goodput(interval, delta, restart, mtbf))
        for name, interval in (("current", current), ("young", young_interval(delta, mtbf)),
                               ("daly", daly_interval(delta, mtbf)))
        if interval is not None
    ]
    best = next(r for r in rows if r.name == "daly")
    summary = f"checkpoint every {_duration(best.interval_seconds)}"
    if best.interval_steps:
        summary += f" (~{best.interval_steps:.0f} steps)"
    if current is not None:
        now = rows[0]
        summary += (f" instead of every {_duration(current)}: expected goodput (first-order model) "
                    f"{now.expected_goodput:.1%} -> {best.expected_goodput:.1%}")
    summary += f"; MTBF {_duration(mtbf)} from {source}"
    if delta > 0.1 * mtbf or restart > 0.1 * mtbf:
        summary += ("; the first-order model is optimistic when checkpoint or restart cost is this large next to the "
                    "MTBF: check with `goodput simulate-interval`")
    return CheckpointAdvice(inputs=inputs, intervals=rows, summary=summary)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
