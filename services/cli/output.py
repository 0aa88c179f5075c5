"""Tables printed by `goodput runs` and `goodput ledger`."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx

from services.cli.tokens import read_headers
from services.presentation import CATEGORIES



def _get(url: str, project: str | None = None) -> httpx.Response:
    try:
        return httpx.get(url, timeout=60.0, headers=read_headers(), params={"project": project} if project else None)
    except httpx.HTTPError as exc:
        raise SystemExit(f"goodput: cannot reach the collector at {url}: {exc}. Is `goodput serve` running?") from exc


def print_runs(base: str, *, project: str | None = None) -> int:
    response = _get(f"{base}/v1/runs", project)
    if response.status_code != 200:
        print(response.text)
        return 1
    runs = response.json()["runs"]
    if not runs:
        print("no runs yet: instrument a training script (see README) or try `goodput simulate`")
        return 0
    print(f"{'run':<32} {'project':<16} {'status':<10} {'GPU-h':>9} {'goodput':>8}  "
          + " ".join(f"{c:>10}" for c in CATEGORIES))
    for run in runs:
        alloc = run["allocated_gpu_seconds"]
        goodput = f"{run['goodput']:.1%}" if run["goodput"] is not None else "-"
        shares = " ".join(f"{(run['waste_gpu_seconds'][c] / alloc if alloc else 0):>10.1%}" for c in CATEGORIES)
        print(f"{run['run_id'][:32]:<32} {run['project'][:16]:<16} {run['status']:<10} {alloc / 3600:>9.2f} "
              f"{goodput:>8}  {shares}")
    return 0


def print_ledger(base: str, run_id: str, *, as_json: bool = False, project: str | None = None) -> int:
    response = _get(f"{base}/v1/runs/{quote(run_id, safe='')}/waste", project)
    if response.status_code != 200:
        print(response.json().get("error", {}).get("message", response.text))
        return 1
    ledger = response.json()
    if as_json:
        print(json.dumps(ledger, indent=2))
        return 0
    alloc = ledger["allocated_gpu_seconds"]
    print(f"run {ledger['run_id']}  status {ledger['status']}  restarts {ledger['restarts']}  "
          f"queue {ledger['queue_seconds']:.0f} s")
    print(f"{'':<12} {'GPU-seconds':>14} {'GPU-hours':>10} {'share':>7}")
    rows = [("allocated", alloc), ("productive", ledger["productive_gpu_seconds"])]
    rows += [(c, ledger["waste_gpu_seconds"][c]) for c in CATEGORIES]
    for name, value in rows:
        share = f"{value / alloc:.1%}" if alloc else "-"
        print(f"{name:<12} {value:>14.1f} {value / 3600:>10.3f} {share:>7}")
    if ledger["goodput"] is not None:
        print(f"goodput {ledger['goodput']:.2%}")
    return 0
