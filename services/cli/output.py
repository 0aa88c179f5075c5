"""Tables printed by `goodput runs` and `goodput ledger`: every number through services.presentation, as the
dashboard and the reports write it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from services import presentation as fmt
from services.api_client import ApiClient
from services.presentation import CATEGORIES
from services.schemas.categories import EVAL
from services.schemas.runs import RunListItem

RUN_COLUMN_MAX = 40
PROJECT_COLUMN_MAX = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    project: str | None = None
    status: str | None = None
    since: float | None = None  # epoch seconds: runs with events at or after
    until: float | None = None
    run_id: str | None = None  # a part of the run id
    limit: int | None = None  # the worst this many


def wasted_gpu_seconds(run: RunListItem) -> float:
    return run.waste_gpu_seconds.total()


def worst_first(runs: list[RunListItem]) -> list[RunListItem]:
    """The runs that wasted the most GPU-seconds first (ties: the most recent first, then by id)."""
    return sorted(runs, key=lambda r: (-wasted_gpu_seconds(r), -(r.last_time or 0.0), r.run_id))


def _biggest_waste(run: RunListItem) -> str:
    category, gpu_s = max(run.waste_gpu_seconds.items(), key=lambda kv: kv[1])
    return f"{category} {fmt.share(gpu_s, run.allocated_gpu_seconds)}" if gpu_s > 0 else fmt.DASH


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def print_runs(api: ApiClient, selection: RunFilter = RunFilter(), *, as_json: bool = False) -> int:
    """One line per run, worst first: allocated and wasted GPU time, goodput, the biggest waste category."""
    runs = worst_first(api.runs(project=selection.project, status=selection.status, since=selection.since,
                                until=selection.until, run_id=selection.run_id).runs)
    if selection.limit is not None:
        runs = runs[:selection.limit]
    if as_json:
        rows = [{**r.model_dump(mode="json"), "wasted_gpu_seconds": wasted_gpu_seconds(r)} for r in runs]
        print(json.dumps({"runs": rows, "count": len(rows)}, indent=2))
        return 0
    if not runs:
        print("no runs match: instrument a training script (see README) or try `goodput simulate`"
              if selection == RunFilter() else "no runs match these filters")
        return 0
    run_w = min(max(len("run"), *(len(r.run_id) for r in runs)), RUN_COLUMN_MAX)
    project_w = min(max(len("project"), *(len(r.project) for r in runs)), PROJECT_COLUMN_MAX)
    unit = fmt.gpu_time_unit(*(r.allocated_gpu_seconds for r in runs))  # one unit for the table, as on the fleet page
    print(f"{'run':<{run_w}} {'project':<{project_w}} {'status':<9} {unit.symbol:>10} {'wasted':>10} {'goodput':>7}  "
          "biggest waste")
    for run in runs:
        print(f"{_clip(run.run_id, run_w):<{run_w}} {_clip(run.project, project_w):<{project_w}} {run.status:<9} "
              f"{fmt.gpu_time(run.allocated_gpu_seconds, unit, with_unit=False):>10} "
              f"{fmt.gpu_time(wasted_gpu_seconds(run), unit, with_unit=False):>10} {fmt.percent(run.goodput):>7}  "
              f"{_biggest_waste(run)}")
    return 0


def print_ledger(api: ApiClient, run_id: str, *, as_json: bool = False, project: str | None = None) -> int:
    ledger = api.ledger(run_id, project=project)
    if as_json:
        print(json.dumps(ledger.model_dump(mode="json"), indent=2))
        return 0
    alloc = ledger.allocated_gpu_seconds
    print(f"run {ledger.run_id}  status {ledger.status}  restarts {ledger.restarts}  "
          f"queue {fmt.duration(ledger.queue_seconds)}")
    unit = fmt.gpu_time_unit(alloc)  # the unit the run's size calls for, as on its page
    print(f"{'':<12} {'GPU-seconds':>14} {unit.title:>11} {'share':>7}")
    rows = [("allocated", alloc), ("productive", ledger.productive_gpu_seconds), (EVAL, ledger.eval_gpu_seconds)]
    rows += [(c, ledger.waste_gpu_seconds[c]) for c in CATEGORIES]
    for name, value in rows:
        print(f"{name:<12} {fmt.gpu_seconds(value):>14} {fmt.gpu_time(value, unit, with_unit=False):>11} "
              f"{fmt.share(value, alloc):>7}")
        if name == "startup":
            for label, part in fmt.startup_split(ledger.startup_parts):
                print(f"  {label:<10} {fmt.gpu_seconds(part):>14} {fmt.gpu_time(part, unit, with_unit=False):>11} "
                      f"{fmt.share(part, alloc):>7}")
    if ledger.goodput is not None:
        print(f"goodput {fmt.percent(ledger.goodput)}")
    return 0


def print_failures(api: ApiClient, run_id: str, *, as_json: bool = False, project: str | None = None) -> int:
    """One line per failed attempt: when, at which step, and why (services.presentation.failure_cause)."""
    timeline = api.view(run_id, project=project).timeline
    if as_json:
        print(json.dumps([f.model_dump(mode="json") for f in timeline.failures], indent=2))
        return 0
    if not timeline.failures:
        print(f"run {run_id}: no failed attempt")
        return 0
    shown = len(timeline.failures)
    more = f" (the latest {shown} of {timeline.failures_total})" if timeline.failures_truncated else ""
    print(f"run {run_id}: {timeline.failures_total} failed attempt{'s' if timeline.failures_total != 1 else ''}{more}")
    for f in timeline.failures:
        where = "during startup" if f.step is None else f"at step {fmt.integer(f.step)}"
        print(f"attempt {f.attempt}  {fmt.timestamp(f.time)}  {f.reason} {where}: {fmt.failure_cause(f.cause)}")
    return 0
