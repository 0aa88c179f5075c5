"""Tables printed by `goodput runs` and `goodput ledger`."""

from __future__ import annotations

import json

from services import presentation as fmt
from services.api_client import ApiClient
from services.presentation import CATEGORIES


def print_runs(api: ApiClient, *, project: str | None = None) -> int:
    runs = api.runs(project=project).runs
    if not runs:
        print("no runs yet: instrument a training script (see README) or try `goodput simulate`")
        return 0
    print(f"{'run':<32} {'project':<16} {'status':<10} {'GPU-h':>9} {'goodput':>8}  "
          + " ".join(f"{c:>10}" for c in CATEGORIES))
    for run in runs:
        alloc = run.allocated_gpu_seconds
        shares = " ".join(f"{fmt.share(run.waste_gpu_seconds[c], alloc):>10}" for c in CATEGORIES)
        print(f"{run.run_id[:32]:<32} {run.project[:16]:<16} {run.status:<10} "
              f"{fmt.gpu_hours(alloc, unit=False):>9} {fmt.percent(run.goodput):>8}  {shares}")
    return 0


def print_ledger(api: ApiClient, run_id: str, *, as_json: bool = False, project: str | None = None) -> int:
    ledger = api.ledger(run_id, project=project)
    if as_json:
        print(json.dumps(ledger.model_dump(mode="json"), indent=2))
        return 0
    alloc = ledger.allocated_gpu_seconds
    print(f"run {ledger.run_id}  status {ledger.status}  restarts {ledger.restarts}  "
          f"queue {fmt.duration(ledger.queue_seconds)}")
    print(f"{'':<12} {'GPU-seconds':>14} {'GPU-hours':>10} {'share':>7}")
    rows = [("allocated", alloc), ("productive", ledger.productive_gpu_seconds)]
    rows += [(c, ledger.waste_gpu_seconds[c]) for c in CATEGORIES]
    for name, value in rows:
        print(f"{name:<12} {fmt.gpu_seconds(value):>14} {fmt.gpu_hours(value, unit=False):>10} "
              f"{fmt.share(value, alloc):>7}")
    if ledger.goodput is not None:
        print(f"goodput {fmt.percent(ledger.goodput)}")
    return 0
