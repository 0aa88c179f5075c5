"""Tables printed by `goodput runs` and `goodput ledger`: every number through services.presentation, as the
dashboard and the reports write it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from services import presentation as fmt
from services.api_client import ApiClient
from services.presentation import CATEGORIES
from services.schemas.categories import EVAL
from services.schemas.fleet import FleetWindow
from services.schemas.live import LiveRun
from services.schemas.runs import RunListItem

RUN_COLUMN_MAX = 40
PROJECT_COLUMN_MAX = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    project: str | None = None
    status: str | None = None
    since: float | None = None  # epoch seconds: runs with events at or after
    until: float | None = None
    last: str | None = None  # the last DURATION (90m, 24h) on the collector's clock, instead of since
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


def in_range(window: FleetWindow) -> list[RunListItem]:
    """The runs of /v1/fleet/window with their figures cut to the range, as the dashboard's fleet page shows them."""
    return [r.run.model_copy(update={
        "allocated_gpu_seconds": r.window.allocated_gpu_seconds,
        "productive_gpu_seconds": r.window.productive_gpu_seconds, "eval_gpu_seconds": r.window.eval_gpu_seconds,
        "goodput": r.window.goodput,
        "waste_gpu_seconds": r.window.waste_gpu_seconds}) for r in window.runs]


LiveByRun = dict[tuple[str, str], LiveRun]  # (project, run id) -> live status


def listed_runs(api: ApiClient, selection: RunFilter) -> tuple[list[RunListItem], LiveByRun, float]:
    """(the runs, worst first, each cut to the range when one is given; the running ones' live status; the
    collector's clock). A range goes through the dashboard's rule and endpoint: `last_range` on the collector's clock,
    then /v1/fleet/window, so `--last 1h` gives the figures of the fleet page's "Last hour"."""
    live = api.live_runs(project=selection.project)
    since, until = (fmt.last_range(selection.last, live.server_time) if selection.last
                    else (selection.since, selection.until))
    if since is None and until is None:
        runs = api.runs(project=selection.project, status=selection.status, run_id=selection.run_id).runs
    else:
        runs = in_range(api.fleet_window(since=since, until=until, status=selection.status, run_id=selection.run_id,
                                         project=selection.project, buckets=1))
    runs = worst_first(runs)
    if selection.limit is not None:
        runs = runs[:selection.limit]
    return runs, {(r.project, r.run_id): r for r in live.runs}, live.server_time


def last_progress(run: RunListItem, live: LiveRun | None, now: float) -> str:
    """How long ago the run last made progress (a running run: its last step end, checkpoint or start; an ended
    one: its last event), and `hung` when live detection says so."""
    ago = live.seconds_since_progress if live is not None else (now - run.last_time if run.last_time else None)
    text = fmt.DASH if ago is None else f"{fmt.duration(ago)} ago"
    return f"{text}, hung" if live is not None and live.hung else text


def print_runs(api: ApiClient, selection: RunFilter = RunFilter(), *, as_json: bool = False) -> int:
    """One line per run, worst first: allocated and wasted GPU time, goodput, the biggest waste category, the last
    progress and whether the run is hung."""
    runs, live, now = listed_runs(api, selection)
    if as_json:
        rows = [{**r.model_dump(mode="json"), "wasted_gpu_seconds": wasted_gpu_seconds(r),
                 "hung": bool((lv := live.get((r.project, r.run_id))) and lv.hung),
                 "seconds_since_progress": lv.seconds_since_progress if lv else None} for r in runs]
        print(json.dumps({"runs": rows, "count": len(rows)}, indent=2))
        return 0
    if not runs:
        print("no runs match: instrument a training script (see README) or try `goodput simulate`"
              if selection == RunFilter() else "no runs match these filters")
        return 0
    run_w = min(max(len("run"), *(len(r.run_id) for r in runs)), RUN_COLUMN_MAX)
    project_w = min(max(len("project"), *(len(r.project) for r in runs)), PROJECT_COLUMN_MAX)
    unit = fmt.gpu_time_unit(*(r.allocated_gpu_seconds for r in runs))  # one unit for the table, as on the fleet page
    print(f"{'run':<{run_w}} {'project':<{project_w}} {'status':<9} {unit.symbol:>12} {'wasted':>12} {'goodput':>7}  "
          f"{'biggest waste':<16} last progress")
    for run in runs:
        print(f"{_clip(run.run_id, run_w):<{run_w}} {_clip(run.project, project_w):<{project_w}} {run.status:<9} "
              f"{fmt.gpu_time(run.allocated_gpu_seconds, unit, with_unit=False):>12} "
              f"{fmt.gpu_time(wasted_gpu_seconds(run), unit, with_unit=False):>12} {fmt.percent(run.goodput):>7}  "
              f"{_biggest_waste(run):<16} {last_progress(run, live.get((run.project, run.run_id)), now)}")
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
    in_unit = unit is not fmt.GPU_SECONDS  # a second column only when it says something the first does not
    print(f"{'':<12} {'GPU-seconds':>14}" + (f" {unit.title:>13}" if in_unit else "") + f" {'share':>7}")
    rows = [("allocated", alloc), ("productive", ledger.productive_gpu_seconds), (EVAL, ledger.eval_gpu_seconds)]
    rows += [(c, ledger.waste_gpu_seconds[c]) for c in CATEGORIES]
    for name, value in rows:
        print(f"{name:<12} {fmt.gpu_seconds(value):>14}"
              + (f" {fmt.gpu_time(value, unit, with_unit=False):>13}" if in_unit else "")
              + f" {fmt.share(value, alloc):>7}")
        if name == "startup":
            for label, part in fmt.startup_split(ledger.startup_parts):
                print(f"  {label:<10} {fmt.gpu_seconds(part):>14}"
                      + (f" {fmt.gpu_time(part, unit, with_unit=False):>13}" if in_unit else "")
                      + f" {fmt.share(part, alloc):>7}")
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
